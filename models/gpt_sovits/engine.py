"""The autoregressive engine for the GPT-SoVITS v2 text-to-semantic (T2S) transformer.

    model = load_t2s_checkpoint("s1bert25hz.ckpt").model
    weights = T2SWeights.from_state_dict(model.config, model.state_dict(), torch.float16, "cuda")
    engine = T2SEngine(weights, max_batch=64, max_len=2048)
    engine.capture_graphs()                       # CUDA: one graph per (batch, cache length, sampler) bucket
    results = engine.generate([T2SRequest(phoneme_ids, bert_features, prompt_tokens, top_k=15), ...])

What it does, and why:

* **Static KV cache** ``(layers, slots, max_len, 2 * d)``: keys and values of one position sit side
  by side, so one indexed write per layer stores both. A row's cache holds its text, its prompt and
  the tokens fed so far from position 0; attention reads a length bucket of it and masks keys at
  or past the row's valid length. Nothing grows and nothing is copied per step.
* **Prefill** (``prefill``: the text and prompt pass of the requests admitted together, one padded
  eager batch of up to ``prefill_batch``, each row masked to its own positions) and the
  **decode step** (``decode_step``: one token for each row of a batch bucket) are separate.
  The decode step embeds, runs every layer, writes the cache, chooses the token on the device
  (``engine_sampling``) and updates each row's counters and stop flags, so a CUDA graph of it is
  the whole step. The host reads the stop flags only every ``sync_every`` steps.
* **Continuous batching**: a request takes the lowest free slot when one is free, and leaves it
  at the first check after it stops; the batch bucket is the smallest captured size that covers
  the highest occupied slot. Rows are independent (each has its own cache, lengths, positions,
  repetition history and sampling settings), so a greedy request decodes the same tokens alone or
  in any batch.
* **Decoding rules** are those of the official ``infer_panel``: the text attends text both ways,
  the prompt attends all text and itself causally; each new token attends the whole cache; the
  token chosen at step i sits at audio position ``prompt_len + i``; EOS is blocked before step 11;
  decoding stops when the chosen token or the penalised argmax is EOS (the token is dropped), when
  more than ``early_stop_num`` tokens were made, or at step ``max_steps - 1`` (the token is kept).

On CPU the same functions run eagerly in float32; the tests compare them with the official
fixtures token for token. ``engine_triton.TritonT2SEngine`` is this engine with the decode step as
fused Triton kernels (GPU only), and ``engine_persistent.PersistentT2SEngine`` the same with the
batch-1 step as one persistent kernel; the eager port (``t2s.py`` decoded by ``t2s_decode``) is what
they are measured against (``scripts/bench_gpt_sovits_t2s.py``).
"""
from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.gpt_sovits.engine_sampling import RowSampling, choose_tokens
from models.gpt_sovits.engine_weights import (
    LAYER_NORM_EPS,
    POSITION_TABLE_LEN,
    T2SLayerWeights,
    T2SWeights,
)

OFFICIAL_EOS_FROM_STEP = 11  # the official loop drops the EOS column for steps 0..10 (0.4 s of audio)
OFFICIAL_MAX_STEPS = 1500  # the official loop's hard limit


@dataclass(frozen=True)
class T2SRequest:
    """One sentence to decode. ``prompt_tokens`` None is the official reference-free mode."""

    phoneme_ids: torch.Tensor  # (T,) int64: prompt phones then target phones
    bert_features: torch.Tensor  # (1024, T) float
    prompt_tokens: torch.Tensor | None  # (P,) int64 semantic tokens of the reference clip
    top_k: int = 1
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.35
    early_stop_num: int = -1  # -1: no early stop
    max_steps: int = OFFICIAL_MAX_STEPS
    eos_from_step: int = OFFICIAL_EOS_FROM_STEP  # >= max_steps decodes exactly max_steps tokens (timing)


@dataclass(frozen=True)
class T2SResult:
    tokens: torch.Tensor  # (n,) int64 on the CPU: the generated tokens kept
    stop_step: int  # the loop index at the stop
    stopped_by: str  # "eos", "early_stop" or "max_steps"
    reference_free: bool

    @property
    def official_idx(self) -> int:
        """What ``infer_panel`` returns as ``idx``: the stop step, but 0 in reference-free mode."""
        return 0 if self.reference_free else self.stop_step


def after_attention(x: torch.Tensor, attention: torch.Tensor, layer: T2SLayerWeights) -> torch.Tensor:
    """The rest of a post-norm layer for one token a row: x (B, d) and its attention (B, d) ->
    LayerNorm(y + FFN(y)) with y = LayerNorm(x + W_o attention), in cuBLAS products."""
    d = x.shape[-1]
    x = F.layer_norm(x + torch.addmm(layer.out_bias, attention, layer.out_weight.t()), (d,), layer.norm1_weight,
                     layer.norm1_bias, LAYER_NORM_EPS)
    hidden = torch._addmm_activation(layer.ffn1_bias, x, layer.ffn1_weight.t())  # relu fused in the GEMM
    return F.layer_norm(x + torch.addmm(layer.ffn2_bias, hidden, layer.ffn2_weight.t()), (d,), layer.norm2_weight,
                        layer.norm2_bias, LAYER_NORM_EPS)


def _buckets(limit: int, start: int) -> list[int]:
    """Powers of two from ``start`` below ``limit``, then ``limit`` itself."""
    sizes = []
    size = start
    while size < limit:
        sizes.append(size)
        size *= 2
    return sizes + [limit]


class T2SEngine:
    """A static-cache, continuously batched T2S decoder over ``max_batch`` slots."""

    def __init__(
        self,
        weights: T2SWeights,
        max_batch: int = 1,
        max_len: int = 2048,
        sync_every: int = 16,
        seed: int = 0,
        batch_buckets: list[int] | None = None,
        length_buckets: list[int] | None = None,
        prefill_batch: int = 16,
    ):
        config = weights.config
        if max_len > POSITION_TABLE_LEN:
            raise ValueError(f"max_len {max_len} exceeds the {POSITION_TABLE_LEN} positions of the official tables")
        if max_len % 16:
            raise ValueError(f"max_len {max_len} must be a multiple of 16 (attention bias alignment)")
        self.weights = weights
        self.config = config
        self.max_batch = max_batch
        self.max_len = max_len
        self.sync_every = sync_every
        if prefill_batch < 1:
            raise ValueError(f"prefill_batch {prefill_batch} must be >= 1")
        self.prefill_batch = prefill_batch
        self.seed = seed
        self.batch_buckets = sorted(batch_buckets or _buckets(max_batch, 1))
        self.length_buckets = sorted(length_buckets or _buckets(max_len, 128))
        if self.batch_buckets[-1] != max_batch or self.length_buckets[-1] != max_len:
            raise ValueError(
                f"the largest buckets must be max_batch {max_batch} and max_len {max_len}; "
                f"got {self.batch_buckets} and {self.length_buckets}"
            )
        if any(length % 16 for length in self.length_buckets):
            raise ValueError(f"length buckets {self.length_buckets} must be multiples of 16")
        device, dtype = weights.device, weights.dtype
        slots, vocab = max_batch, config.vocab_size
        self.device = device
        # (layers, slots, positions, 2 * d): key then value of each position, side by side.
        self.kv_cache = torch.zeros(config.num_layers, slots, max_len, 2 * config.hidden_dim, dtype=dtype, device=device)

        def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.cache_len = zeros(slots)  # valid cache positions of each row
        self.audio_pos = zeros(slots)  # audio position of the next input token
        self.last_token = zeros(slots)  # the next input token
        self.step = zeros(slots)  # the official loop index of the next choice
        self.done = torch.ones(slots, dtype=torch.bool, device=device)
        self.stop_step = zeros(slots)
        self.stop_by_eos = zeros(slots, dtype=torch.bool)
        self.early_stop = zeros(slots)
        self.max_steps = zeros(slots)
        self.seen = zeros(slots, vocab, dtype=torch.bool)  # ids in the prompt or generated: penalised
        self.tokens = zeros(slots, OFFICIAL_MAX_STEPS)
        self.sampling = RowSampling(
            top_k=torch.ones(slots, dtype=torch.int64, device=device),
            top_p=torch.ones(slots, device=device),
            temperature=torch.ones(slots, device=device),
            repetition_penalty=torch.ones(slots, device=device),
            eos_from_step=zeros(slots),
        )
        self._slot_ids = torch.arange(slots, device=device)
        self._key_positions = torch.arange(max_len, device=device)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        # Host bookkeeping: what each slot holds, its cache length and how far it may run.
        self._slot_request: list[int | None] = [None] * slots
        self._slot_greedy = [True] * slots
        self._slot_reference_free = [False] * slots
        self._host_len = [0] * slots
        self._waiting: collections.deque[tuple[int, T2SRequest]] = collections.deque()
        self._results: dict[int, T2SResult] = {}
        self._request_ids = itertools.count()

    # ---- the two computations -------------------------------------------------------------

    def _prompt_rows(self, request: T2SRequest) -> torch.Tensor:
        """(n, d) input rows of one request: its text (embedding + BERT projection + positions),
        then its prompt tokens (embedding + positions)."""
        w = self.weights
        phoneme_ids = request.phoneme_ids.to(self.device)
        bert = request.bert_features.to(device=self.device, dtype=w.dtype)  # (1024, T)
        x = w.text_embedding[phoneme_ids] + F.linear(bert.transpose(0, 1), w.bert_proj_weight, w.bert_proj_bias)
        x = x + w.text_positions[: phoneme_ids.shape[0]]  # (T, d)
        if request.prompt_tokens is None:
            return x
        prompt = request.prompt_tokens.to(self.device)
        audio = w.audio_embedding[prompt] + w.audio_positions[: prompt.shape[0]]  # (P, d)
        return torch.cat([x, audio], dim=0)

    @torch.no_grad()
    def prefill(self, slots: list[int], requests: list[T2SRequest]) -> None:
        """Run the text and prompt pass of each request into its slot in one padded batch, and
        choose each one's first token. A row attends only its own positions, so its cache and
        first token do not depend on what it was batched with."""
        w, config = self.weights, self.config
        d, heads = config.hidden_dim, config.num_heads
        text_lens = [request.phoneme_ids.shape[0] for request in requests]
        prompt_lens = [0 if request.prompt_tokens is None else request.prompt_tokens.shape[0] for request in requests]
        lengths = [text + prompt for text, prompt in zip(text_lens, prompt_lens)]
        batch, longest = len(requests), max(lengths)
        x = torch.zeros(batch, longest, d, dtype=w.dtype, device=self.device)
        # Text rows see all text and no audio; audio rows see all text and earlier audio. Padding
        # rows see only themselves (a row that sees nothing would be NaN) and no real row sees them.
        allowed = torch.eye(longest, dtype=torch.bool, device=self.device).repeat(batch, 1, 1)  # (B, n, n)
        for row, (request, text_len, length) in enumerate(zip(requests, text_lens, lengths)):
            x[row, :length] = self._prompt_rows(request)
            allowed[row, :length, :text_len] = True
            allowed[row, text_len:length, text_len:length] = torch.ones(
                length - text_len, length - text_len, dtype=torch.bool, device=self.device).tril()
        row_ids = torch.cat([torch.full((length,), row, device=self.device) for row, length in enumerate(lengths)])
        positions = torch.cat([torch.arange(length, device=self.device) for length in lengths])
        slot_ids = torch.tensor(slots, device=self.device)[row_ids]  # (sum of lengths,)
        for index, layer in enumerate(w.layers):
            qkv = F.linear(x, layer.qkv_weight, layer.qkv_bias)  # (B, n, 3d)
            self.kv_cache[index].index_put_((slot_ids, positions), qkv[row_ids, positions, d:])
            q, k, v = qkv.unflatten(-1, (3, heads, config.head_dim)).permute(2, 0, 3, 1, 4)  # 3 x (B, H, n, Dh)
            attention = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed.unsqueeze(1))  # (B, H, n, Dh)
            attention = attention.transpose(1, 2).reshape(batch, longest, d)
            x = F.layer_norm(
                x + F.linear(attention, layer.out_weight, layer.out_bias), (d,), layer.norm1_weight, layer.norm1_bias,
                LAYER_NORM_EPS,
            )
            hidden = F.relu(F.linear(x, layer.ffn1_weight, layer.ffn1_bias))
            x = F.layer_norm(
                x + F.linear(hidden, layer.ffn2_weight, layer.ffn2_bias), (d,), layer.norm2_weight, layer.norm2_bias,
                LAYER_NORM_EPS,
            )
        last = torch.tensor(lengths, device=self.device) - 1
        logits = F.linear(x[torch.arange(batch, device=self.device), last], w.predict_weight).float()  # (B, V)

        for row, (slot, request) in enumerate(zip(slots, requests)):
            rows = slice(slot, slot + 1)
            self.step[rows] = 0
            self.done[rows] = False
            self.stop_step[rows] = 0
            self.stop_by_eos[rows] = False
            self.early_stop[rows] = request.early_stop_num
            self.max_steps[rows] = request.max_steps
            self.seen[rows] = False
            if request.prompt_tokens is not None:
                self.seen[slot, request.prompt_tokens.to(self.device)] = True
            self.sampling.top_k[rows] = request.top_k
            self.sampling.top_p[rows] = request.top_p
            self.sampling.temperature[rows] = request.temperature
            self.sampling.repetition_penalty[rows] = request.repetition_penalty
            self.sampling.eos_from_step[rows] = request.eos_from_step
            self._choose_and_record(rows, logits[row : row + 1], greedy=request.top_k == 1)
            self.cache_len[rows] = lengths[row]
            self.audio_pos[rows] = prompt_lens[row]

    @torch.no_grad()
    def decode_step(self, batch: int, cache_bucket: int, greedy: bool) -> None:
        """One token for slots ``0..batch-1``, attending cache positions ``0..cache_bucket-1``."""
        w, config = self.weights, self.config
        d, heads = config.hidden_dim, config.num_heads
        rows = slice(0, batch)
        write_pos = self.cache_len[rows].clamp(max=self.max_len - 1)  # (B,)
        x = w.audio_embedding[self.last_token[rows]] + w.audio_positions[self.audio_pos[rows].clamp(max=POSITION_TABLE_LEN - 1)]
        # (B, 1, 1, Lb) additive mask: keys past the row's valid length (its new token included) are out.
        key_valid = self._key_positions[:cache_bucket].unsqueeze(0) <= write_pos.unsqueeze(1)  # (B, Lb)
        bias = torch.zeros(key_valid.shape, dtype=w.dtype, device=self.device).masked_fill(~key_valid, float("-inf"))
        bias = bias.view(batch, 1, 1, cache_bucket)
        slot_ids = self._slot_ids[rows]
        for index, layer in enumerate(w.layers):
            qkv = torch.addmm(layer.qkv_bias, x, layer.qkv_weight.t())  # (B, 3d)
            self.kv_cache[index].index_put_((slot_ids, write_pos), qkv[:, d:])
            q = qkv[:, :d].unflatten(1, (heads, 1, config.head_dim))  # (B, H, 1, Dh)
            cache = self.kv_cache[index, rows, :cache_bucket].unflatten(2, (2, heads, config.head_dim))  # (B, Lb, 2, H, Dh)
            keys = cache[:, :, 0].transpose(1, 2)  # (B, H, Lb, Dh)
            values = cache[:, :, 1].transpose(1, 2)
            attention = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias).reshape(batch, d)
            x = after_attention(x, attention, layer)
        logits = (x @ w.predict_weight.t()).float()  # (B, V)
        self._choose_and_record(rows, logits, greedy)
        self.cache_len[rows].add_(1)
        self.audio_pos[rows].add_(1)

    def _choose_and_record(self, rows: slice, logits: torch.Tensor, greedy: bool) -> None:
        """Choose each row's token, store it, and raise its stop flag at the official stop."""
        step = self.step[rows]
        token, stop_by_eos = choose_tokens(
            logits, self.seen[rows], self.sampling.rows(rows), step, self.config.eos_id, self.generator, greedy
        )
        early = (self.early_stop[rows] >= 0) & (step + 1 > self.early_stop[rows])
        last = step >= self.max_steps[rows] - 1
        done, stop_step, stop_by_eos_row = self.done[rows], self.stop_step[rows], self.stop_by_eos[rows]  # views
        stopping = ~done & (stop_by_eos | early | last)
        stop_step.copy_(torch.where(stopping, step, stop_step))
        stop_by_eos_row.copy_(torch.where(stopping, stop_by_eos, stop_by_eos_row))
        done.logical_or_(stopping)
        column = step.clamp(max=self.tokens.shape[1] - 1)
        self.tokens[rows].index_put_((self._slot_ids[: column.shape[0]], column), token)
        self.seen[rows].scatter_(1, token.unsqueeze(1), True)
        self.last_token[rows].copy_(token)
        step.add_(1)

    # ---- CUDA graphs ----------------------------------------------------------------------

    def capture_graphs(self, greedy_modes: tuple[bool, ...] = (True, False)) -> None:
        """Capture one decode-step graph per (batch bucket, length bucket, sampler). Must run
        while no request is in flight: the warm-up steps overwrite the state, which is reset after."""
        if self.device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device; this engine is on {self.device}")
        if any(request is not None for request in self._slot_request) or self._waiting:
            raise RuntimeError("capture_graphs() must run before any request is submitted")
        pool = torch.cuda.graph_pool_handle()
        side_stream = torch.cuda.Stream(self.device)
        side_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side_stream):
            for batch, bucket, greedy in itertools.product(self.batch_buckets, self.length_buckets, greedy_modes):
                self.decode_step(batch, bucket, greedy)  # warm-up: library handles, kernel choice, JIT
        torch.cuda.current_stream(self.device).wait_stream(side_stream)
        # This engine's own capture stream: cuBLAS keeps a workspace per stream and a captured product
        # keeps its address, so engines captured on torch's one shared capture stream and replayed at
        # the same time (engine_shards.py) would write one workspace at once.
        capture_stream = torch.cuda.Stream(self.device)
        for batch, bucket, greedy in itertools.product(self.batch_buckets, self.length_buckets, greedy_modes):
            graph = torch.cuda.CUDAGraph()
            if not greedy:
                if not hasattr(graph, "register_generator_state"):
                    raise RuntimeError("sampling inside a CUDA graph needs torch >= 2.6 (register_generator_state)")
                graph.register_generator_state(self.generator)
            with torch.cuda.graph(graph, pool=pool, stream=capture_stream):
                self.decode_step(batch, bucket, greedy)
            self._graphs[(batch, bucket, greedy)] = graph
        torch.cuda.synchronize(self.device)
        self._reset_state()

    def _reset_state(self) -> None:
        for tensor in (self.cache_len, self.audio_pos, self.last_token, self.step, self.stop_step, self.tokens):
            tensor.zero_()
        self.done.fill_(True)
        self.stop_by_eos.fill_(False)
        self.seen.fill_(False)
        self.generator.manual_seed(self.seed)

    # ---- scheduling -----------------------------------------------------------------------

    def submit(self, request: T2SRequest) -> int:
        """Queue ``request``; returns its id. Admission happens between decode steps."""
        self.check_request(request)
        request_id = next(self._request_ids)
        self._waiting.append((request_id, request))
        return request_id

    def check_request(self, request: T2SRequest) -> None:
        """Raise ValueError naming what this engine cannot decode in ``request``."""
        text_len = request.phoneme_ids.shape[0]
        prompt_len = 0 if request.prompt_tokens is None else request.prompt_tokens.shape[0]
        if tuple(request.bert_features.shape) != (self.weights.bert_proj_weight.shape[1], text_len):
            raise ValueError(
                f"bert_features {tuple(request.bert_features.shape)} must be "
                f"({self.weights.bert_proj_weight.shape[1]}, {text_len}) for {text_len} phonemes"
            )
        needed = text_len + prompt_len + request.max_steps
        if needed > self.max_len:
            raise ValueError(
                f"{text_len} phonemes + {prompt_len} prompt tokens + max_steps {request.max_steps} = {needed} "
                f"positions exceed the engine's max_len {self.max_len}"
            )
        if not 1 <= request.max_steps <= OFFICIAL_MAX_STEPS:
            raise ValueError(f"max_steps {request.max_steps} must be in 1..{OFFICIAL_MAX_STEPS}")
        if request.top_k < 1:
            raise ValueError(f"top_k {request.top_k} must be >= 1 (1 is greedy)")

    def has_work(self) -> bool:
        return bool(self._waiting) or any(request is not None for request in self._slot_request)

    def occupied_slots(self) -> list[int]:
        """The slots holding a request (decoding, or stopped and not yet collected), lowest first."""
        return [slot for slot, request in enumerate(self._slot_request) if request is not None]

    def free_slots(self) -> int:
        """Slots neither decoding nor promised to a waiting request (negative when more wait than fit)."""
        return sum(request is None for request in self._slot_request) - len(self._waiting)

    def admit(self) -> None:
        """Prefill waiting requests into free slots, lowest slot first, in batches of at most
        ``prefill_batch`` (one padded pass each, not one pass per request)."""
        free = [slot for slot in range(self.max_batch) if self._slot_request[slot] is None]
        admitted = []
        while self._waiting and free:
            slot = free.pop(0)
            request_id, request = self._waiting.popleft()
            admitted.append((slot, request))
            self._slot_request[slot] = request_id
            self._slot_greedy[slot] = request.top_k == 1
            self._slot_reference_free[slot] = request.prompt_tokens is None
            self._host_len[slot] = request.phoneme_ids.shape[0] + (
                0 if request.prompt_tokens is None else request.prompt_tokens.shape[0]
            )
        for start in range(0, len(admitted), self.prefill_batch):
            group = admitted[start : start + self.prefill_batch]
            self.prefill([slot for slot, _ in group], [request for _, request in group])

    def advance(self, num_steps: int) -> None:
        """Run ``num_steps`` decode steps over the occupied slots with no host synchronisation."""
        occupied = self.occupied_slots()
        if not occupied:
            return
        batch = next(size for size in self.batch_buckets if size > occupied[-1])
        greedy = all(self._slot_greedy[slot] for slot in occupied)
        for _ in range(num_steps):
            # Stopped rows not yet collected keep running; their writes are clamped, so only the
            # cache they no longer need grows. The bucket covers every occupied row's next key.
            longest = min(max(self._host_len[slot] for slot in occupied) + 1, self.max_len)
            bucket = next(size for size in self.length_buckets if size >= longest)
            graph = self._graphs.get((batch, bucket, greedy))
            if graph is not None:
                graph.replay()
            else:
                self.decode_step(batch, bucket, greedy)
            for slot in occupied:
                self._host_len[slot] += 1

    def collect(self) -> list[int]:
        """Read the stop flags (one host sync), free the slots of stopped requests, return their ids."""
        done = self.done.cpu()
        finished = []
        for slot, request_id in enumerate(self._slot_request):
            if request_id is None or not done[slot]:
                continue
            stop_step = int(self.stop_step[slot])
            by_eos = bool(self.stop_by_eos[slot])
            kept = stop_step if by_eos else stop_step + 1
            if by_eos:
                stopped_by = "eos"
            elif stop_step + 1 >= int(self.max_steps[slot]):
                stopped_by = "max_steps"
            else:
                stopped_by = "early_stop"
            self._results[request_id] = T2SResult(
                tokens=self.tokens[slot, :kept].to("cpu", copy=True),  # a copy: the slot is reused
                stop_step=stop_step,
                stopped_by=stopped_by,
                reference_free=self._slot_reference_free[slot],
            )
            self._slot_request[slot] = None
            finished.append(request_id)
        return finished

    def tokens_so_far(self, request_id: int) -> torch.Tensor:
        """(n,) int64 on the CPU: the tokens a running request has chosen so far (one host sync)."""
        slot = self._slot_request.index(request_id)
        return self.tokens[slot, : int(self.step[slot])].to("cpu", copy=True)

    def result(self, request_id: int) -> T2SResult:
        return self._results.pop(request_id)

    def run(self) -> None:
        """Decode until every submitted request has stopped; results wait in ``result(id)``."""
        while self.has_work():
            self.admit()
            self.advance(self.sync_every)
            self.collect()

    def generate(self, requests: list[T2SRequest]) -> list[T2SResult]:
        """Decode ``requests`` with continuous batching; results in the order given."""
        request_ids = [self.submit(request) for request in requests]
        self.run()
        return [self.result(request_id) for request_id in request_ids]
