"""The autoregressive engine for the GPT-SoVITS v2 text-to-semantic (T2S) transformer.

    model = load_t2s_checkpoint("s1bert25hz.ckpt").model
    weights = T2SWeights.from_state_dict(model.config, model.state_dict(), torch.float16, "cuda")
    engine = T2SEngine(weights, max_batch=64, max_len=2048)
    engine.capture_graphs()  # CUDA: decode steps per (batch, cache length, sampler); prefills per (group, length)
    results = engine.generate([T2SRequest(phoneme_ids, bert_features, prompt_tokens, top_k=15), ...])

What it does, and why:

* **Static KV cache** ``(layers, slots, max_len, 2 * d)``: keys and values of one position sit side
  by side, so one indexed write per layer stores both. A row's cache holds its text, its prompt and
  the tokens fed so far from position 0; attention reads a length bucket of it and masks keys at
  or past the row's valid length. Nothing grows and nothing is copied per step.
* **Prefill** (``prefill``: the text and prompt pass of the requests admitted together, one padded
  batch of up to ``prefill_batch``, each row masked to its own positions) and the **decode step**
  (``decode_step``: one token for each row of a batch bucket) are separate. The host packs a
  prefill's requests into device tensors, so the pass itself is captured too, one graph per (group
  size, prefill length bucket): an admission stalls the decode steps for one graph, not the several
  hundred kernel launches of an eager pass.
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

from models.dynamic_int8 import DynamicInt8Linear
from models.gpt_sovits.engine_sampling import RowSampling, choose_tokens
from models.gpt_sovits.engine_weights import (
    LAYER_NORM_EPS,
    POSITION_TABLE_LEN,
    Projection,
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


@dataclass(frozen=True)
class PrefillInputs:
    """The device tensors one prefill pass reads and writes. Captured passes share one allocation
    of the largest group and length bucket and each reads its view of it."""

    ids: torch.Tensor  # (B, n) int64: a row's phoneme ids, then its prompt tokens, then padding
    bert: torch.Tensor  # (B, n, 1024): BERT features of the text positions (later ones projected, then dropped)
    lengths: torch.Tensor  # (3, B) int64: text length, text + prompt length, slot
    logits: torch.Tensor  # (B, V) float32: each row's logits after its last position (written)

    @classmethod
    def allocate(cls, rows: int, positions: int, bert_dim: int, vocab: int, dtype: torch.dtype,
                 device: torch.device) -> PrefillInputs:
        return cls(
            ids=torch.zeros(rows, positions, dtype=torch.int64, device=device),
            bert=torch.zeros(rows, positions, bert_dim, dtype=dtype, device=device),
            lengths=torch.ones(3, rows, dtype=torch.int64, device=device),
            logits=torch.zeros(rows, vocab, device=device),
        )

    def view(self, rows: int, positions: int) -> PrefillInputs:
        return PrefillInputs(self.ids[:rows, :positions], self.bert[:rows, :positions], self.lengths[:, :rows],
                             self.logits[:rows])


@dataclass(frozen=True)
class RowSettings:
    """What a prefill's requests set in their slots, on the device."""

    ints: torch.Tensor  # (B, 4) int64: early stop, max steps, top-k, EOS-from step
    floats: torch.Tensor  # (B, 3) float32: top-p, temperature, repetition penalty
    rows_by_mode: dict[bool, torch.Tensor]  # greedy? -> (n,) rows of the group choosing that way


def project(x: torch.Tensor, weight: Projection, bias: torch.Tensor | None = None, relu: bool = False) -> torch.Tensor:
    """x (..., in) -> (..., out), ReLU'd if asked. A float weight: one GEMM, for a decode step's rows
    (x 2-D) with the bias and ReLU fused into it; a dynamic int8 Linear (CPU): its own product, with
    its own bias."""
    if isinstance(weight, DynamicInt8Linear):
        y = weight(x)
        return F.relu(y) if relu else y
    if x.dim() == 2 and bias is not None:
        return torch._addmm_activation(bias, x, weight.t()) if relu else torch.addmm(bias, x, weight.t())
    y = x @ weight.t() if x.dim() == 2 else F.linear(x, weight, bias)
    return F.relu(y) if relu else y


def after_attention(x: torch.Tensor, attention: torch.Tensor, layer: T2SLayerWeights) -> torch.Tensor:
    """The rest of a post-norm layer for one token a row: x (B, d) and its attention (B, d) ->
    LayerNorm(y + FFN(y)) with y = LayerNorm(x + W_o attention), in cuBLAS products."""
    d = x.shape[-1]
    x = F.layer_norm(x + project(attention, layer.out_weight, layer.out_bias), (d,), layer.norm1_weight,
                     layer.norm1_bias, LAYER_NORM_EPS)
    hidden = project(x, layer.ffn1_weight, layer.ffn1_bias, relu=True)
    return F.layer_norm(x + project(hidden, layer.ffn2_weight, layer.ffn2_bias), (d,), layer.norm2_weight,
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
        prefill_buckets: list[int] | None = None,
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
        # Text + prompt positions of the captured prefill passes; longer prompts prefill eagerly.
        self.prefill_buckets = sorted(prefill_buckets or _buckets(min(max_len, 512), 64))
        if self.prefill_buckets[-1] > max_len:
            raise ValueError(f"prefill buckets {self.prefill_buckets} exceed max_len {max_len}")
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
        self._prefill_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (group size, bucket)
        self._prefill_inputs: PrefillInputs | None = None  # what the captured passes read
        # Host bookkeeping: what each slot holds, its cache length and how far it may run.
        self._slot_request: list[int | None] = [None] * slots
        self._slot_greedy = [True] * slots
        self._slot_reference_free = [False] * slots
        self._host_len = [0] * slots
        self._host_steps_left = [0] * slots  # decode steps before a slot's request reaches its max_steps
        self._waiting: collections.deque[tuple[int, T2SRequest]] = collections.deque()
        self._results: dict[int, T2SResult] = {}
        self._request_ids = itertools.count()

    # ---- the two computations -------------------------------------------------------------

    @torch.no_grad()
    def prefill(self, slots: list[int], requests: list[T2SRequest], positions: int | None = None) -> None:
        """Run the text and prompt pass of each request into its slot in one padded batch, and
        choose each one's first token. A row attends only its own positions, so its cache and
        greedy first token do not depend on what it was batched with.

        The pass itself (``_prefill_pass``) reads only device tensors, so ``capture_graphs`` can
        capture it per (group size, length bucket); the host packs the requests into those tensors
        and sets each slot's counters and sampling settings around it. Without a captured pass the
        batch is padded to its longest row, or to ``positions`` when given."""
        group_size = len(requests)
        text_lens = [request.phoneme_ids.shape[0] for request in requests]
        prompt_lens = [0 if request.prompt_tokens is None else request.prompt_tokens.shape[0] for request in requests]
        lengths = [text + prompt for text, prompt in zip(text_lens, prompt_lens)]
        if positions is not None and not max(lengths) <= positions <= self.max_len:
            raise ValueError(f"positions {positions} cannot hold a prefill of {max(lengths)} "
                             f"within max_len {self.max_len}")
        bucket = next((size for size in self.prefill_buckets if size >= max(lengths)), None)
        graph = self._prefill_graphs.get((group_size, bucket)) if positions in (None, bucket) else None
        if graph is not None:
            inputs = self._prefill_inputs.view(group_size, bucket)
        else:
            inputs = self._allocate_prefill_inputs(group_size, positions or max(lengths))
        ids = torch.zeros(group_size, inputs.ids.shape[1], dtype=torch.int64)  # text ids, then prompt tokens
        for row, request in enumerate(requests):
            ids[row, : text_lens[row]] = request.phoneme_ids
            if request.prompt_tokens is not None:
                ids[row, text_lens[row] : lengths[row]] = request.prompt_tokens
            # (1024, T) -> the row's first T positions. Later positions keep whatever an earlier
            # prefill left: the pass projects them too and then takes the prompt rows there instead.
            inputs.bert[row, : text_lens[row]].copy_(request.bert_features.transpose(0, 1))
        inputs.ids.copy_(ids)
        inputs.lengths.copy_(torch.tensor([text_lens, lengths, slots], dtype=torch.int64))
        settings = self._upload_settings(requests)
        if graph is not None:
            graph.replay()
        else:
            self._prefill_pass(inputs)
        self._start_rows(inputs, settings)

    def _allocate_prefill_inputs(self, rows: int, positions: int) -> PrefillInputs:
        return PrefillInputs.allocate(rows, positions, self.config.bert_feature_dim, self.config.vocab_size,
                                      self.weights.dtype, self.device)

    @torch.no_grad()
    def _prefill_pass(self, inputs: PrefillInputs) -> None:
        """The prefill's device work: embed each row's text and prompt, run every layer writing
        the row's keys and values into its slot, and leave its last position's logits in
        ``inputs.logits``. Positions past a row's length are computed and written too: decode
        steps mask them and overwrite them before any row reads them."""
        w, config = self.weights, self.config
        d, heads = config.hidden_dim, config.num_heads
        batch, padded = inputs.ids.shape
        text_len, length, slot_ids = inputs.lengths  # 3 x (B,)
        positions = torch.arange(padded, device=self.device)  # (n,)
        is_text = positions.unsqueeze(0) < text_len.unsqueeze(1)  # (B, n)
        in_row = positions.unsqueeze(0) < length.unsqueeze(1)  # (B, n)
        text_x = (w.text_embedding[inputs.ids.where(is_text, 0)]
                  + project(inputs.bert, w.bert_proj_weight, w.bert_proj_bias)) + w.text_positions[:padded]
        audio_positions = (positions.unsqueeze(0) - text_len.unsqueeze(1)).clamp(min=0)  # (B, n)
        audio_x = w.audio_embedding[inputs.ids.where(~is_text, 0)] + w.audio_positions[audio_positions]
        x = torch.where((is_text & in_row).unsqueeze(2), text_x, audio_x * in_row.unsqueeze(2))  # (B, n, d)
        # Text rows see all text and no audio; audio rows see all text and earlier audio. Padding
        # rows see only themselves (a row that sees nothing would be NaN) and no real row sees them.
        query, key = positions.view(1, padded, 1), positions.view(1, 1, padded)
        key_is_text = key < text_len.view(batch, 1, 1)
        allowed = (query == key) | (in_row.unsqueeze(2) & (key_is_text | (key <= query)))  # (B, n, n)
        for index, layer in enumerate(w.layers):
            qkv = project(x, layer.qkv_weight, layer.qkv_bias)  # (B, n, 3d)
            self.kv_cache[index, :, :padded].index_copy_(0, slot_ids, qkv[..., d:])
            q, k, v = qkv.unflatten(-1, (3, heads, config.head_dim)).permute(2, 0, 3, 1, 4)  # 3 x (B, H, n, Dh)
            attention = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed.unsqueeze(1))  # (B, H, n, Dh)
            attention = attention.transpose(1, 2).reshape(batch, padded, d)
            x = F.layer_norm(
                x + project(attention, layer.out_weight, layer.out_bias), (d,), layer.norm1_weight, layer.norm1_bias,
                LAYER_NORM_EPS,
            )
            hidden = project(x, layer.ffn1_weight, layer.ffn1_bias, relu=True)
            x = F.layer_norm(
                x + project(hidden, layer.ffn2_weight, layer.ffn2_bias), (d,), layer.norm2_weight, layer.norm2_bias,
                LAYER_NORM_EPS,
            )
        last = x[torch.arange(batch, device=self.device), length - 1]  # (B, d)
        inputs.logits.copy_(project(last, w.predict_weight))

    def _upload_settings(self, requests: list[T2SRequest]) -> RowSettings:
        """The requests' sampling and stop settings on the device, uploaded before the pass runs
        (an upload after it would wait for the whole pass before the host could go on)."""
        ints = torch.tensor([[request.early_stop_num, request.max_steps, request.top_k, request.eos_from_step]
                             for request in requests], dtype=torch.int64)
        floats = torch.tensor([[request.top_p, request.temperature, request.repetition_penalty]
                               for request in requests], dtype=torch.float32)
        greedy = [request.top_k == 1 for request in requests]
        rows = {mode: [row for row, greedy_row in enumerate(greedy) if greedy_row == mode] for mode in (True, False)}
        return RowSettings(ints.to(self.device), floats.to(self.device),
                           {mode: torch.tensor(chosen, device=self.device) for mode, chosen in rows.items() if chosen})

    def _start_rows(self, inputs: PrefillInputs, settings: RowSettings) -> None:
        """Reset the prefilled slots' counters, set their sampling settings and repetition history
        (the prompt tokens), and choose each one's first token from ``inputs.logits``: greedy rows
        together, then sampling rows together (one noise draw for the group, so a seeded sampling
        request's first token depends on the group it was admitted with)."""
        text_len, length, slot_ids = inputs.lengths
        self.step[slot_ids] = 0
        self.done[slot_ids] = False
        self.stop_step[slot_ids] = 0
        self.stop_by_eos[slot_ids] = False
        ints, floats = settings.ints, settings.floats
        self.early_stop[slot_ids], self.max_steps[slot_ids] = ints[:, 0], ints[:, 1]
        self.sampling.top_k[slot_ids], self.sampling.eos_from_step[slot_ids] = ints[:, 2], ints[:, 3]
        self.sampling.top_p[slot_ids] = floats[:, 0]
        self.sampling.temperature[slot_ids] = floats[:, 1]
        self.sampling.repetition_penalty[slot_ids] = floats[:, 2]
        # The prompt tokens are the history the penalty sees; other positions mark a spare column.
        positions = torch.arange(inputs.ids.shape[1], device=self.device)
        is_prompt = (positions.unsqueeze(0) >= text_len.unsqueeze(1)) & (positions.unsqueeze(0) < length.unsqueeze(1))
        vocab = self.config.vocab_size
        seen = torch.zeros(inputs.ids.shape[0], vocab + 1, dtype=torch.bool, device=self.device)
        seen.scatter_(1, inputs.ids.where(is_prompt, vocab), True)
        self.seen[slot_ids] = seen[:, :vocab]
        for greedy, rows in settings.rows_by_mode.items():
            self._choose_and_record(slot_ids[rows], inputs.logits[rows], greedy=greedy)
        self.cache_len[slot_ids] = length
        self.audio_pos[slot_ids] = length - text_len

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
            qkv = project(x, layer.qkv_weight, layer.qkv_bias)  # (B, 3d)
            self.kv_cache[index].index_put_((slot_ids, write_pos), qkv[:, d:])
            q = qkv[:, :d].unflatten(1, (heads, 1, config.head_dim))  # (B, H, 1, Dh)
            cache = self.kv_cache[index, rows, :cache_bucket].unflatten(2, (2, heads, config.head_dim))  # (B, Lb, 2, H, Dh)
            keys = cache[:, :, 0].transpose(1, 2)  # (B, H, Lb, Dh)
            values = cache[:, :, 1].transpose(1, 2)
            attention = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias).reshape(batch, d)
            x = after_attention(x, attention, layer)
        logits = project(x, w.predict_weight).float()  # (B, V)
        self._choose_and_record(rows, logits, greedy)
        self.cache_len[rows].add_(1)
        self.audio_pos[rows].add_(1)

    def _choose_and_record(self, rows: slice | torch.Tensor, logits: torch.Tensor, greedy: bool) -> None:
        """Choose each row's token, store it, and raise its stop flag at the official stop.
        ``rows``: the decode batch's slice of slots, or the slots a prefill filled (an index)."""
        step = self.step[rows]
        token, stop_by_eos = choose_tokens(
            logits, self.seen[rows], self.sampling.rows(rows), step, self.config.eos_id, self.generator, greedy
        )
        early = (self.early_stop[rows] >= 0) & (step + 1 > self.early_stop[rows])
        last = step >= self.max_steps[rows] - 1
        done = self.done[rows]
        stopping = ~done & (stop_by_eos | early | last)
        self.stop_step[rows] = torch.where(stopping, step, self.stop_step[rows])
        self.stop_by_eos[rows] = torch.where(stopping, stop_by_eos, self.stop_by_eos[rows])
        self.done[rows] = done | stopping
        slot_ids = self._slot_ids[rows]
        column = step.clamp(max=self.tokens.shape[1] - 1)
        self.tokens.index_put_((slot_ids, column), token)
        self.seen.index_put_((slot_ids, token), torch.ones_like(token, dtype=torch.bool))
        self.last_token[rows] = token
        self.step[rows] = step + 1

    # ---- CUDA graphs ----------------------------------------------------------------------

    def capture_graphs(self, greedy_modes: tuple[bool, ...] = (True, False), prefill: bool = True) -> None:
        """Capture one decode-step graph per (batch bucket, length bucket, sampler) and, with
        ``prefill``, one prefill pass per (group size up to ``prefill_batch``, prefill bucket), so an
        admission launches one graph instead of several hundred kernels. Must run while no request
        is in flight: the warm-up passes overwrite the state, which is reset after."""
        if self.device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device; this engine is on {self.device}")
        if any(request is not None for request in self._slot_request) or self._waiting:
            raise RuntimeError("capture_graphs() must run before any request is submitted")
        decode_keys = list(itertools.product(self.batch_buckets, self.length_buckets, greedy_modes))
        group_sizes = range(1, min(self.prefill_batch, self.max_batch) + 1)
        prefill_keys = list(itertools.product(group_sizes, self.prefill_buckets)) if prefill else []
        if prefill:
            self._prefill_inputs = self._allocate_prefill_inputs(group_sizes[-1], self.prefill_buckets[-1])
            self._prefill_inputs.lengths[2].zero_()  # every warm-up row writes slot 0, reset after
        pool = torch.cuda.graph_pool_handle()
        # This engine's own stream for warm-up and capture alike. cuBLAS keeps a workspace per stream
        # (32 MiB on Hopper) and a captured product keeps its address: warming up on another stream
        # would hold one workspace more that does not shrink with the dtype, and engines captured on
        # torch's one shared capture stream and replayed at the same time (engine_shards.py) would
        # write one workspace at once.
        capture_stream = torch.cuda.Stream(self.device)
        capture_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(capture_stream):  # warm-up: library handles, kernel choice, JIT
            for batch, bucket, greedy in decode_keys:
                self.decode_step(batch, bucket, greedy)
            for group_size, bucket in prefill_keys:
                self._prefill_pass(self._prefill_inputs.view(group_size, bucket))
        capture_stream.synchronize()
        for batch, bucket, greedy in decode_keys:
            graph = torch.cuda.CUDAGraph()
            if not greedy:
                if not hasattr(graph, "register_generator_state"):
                    raise RuntimeError("sampling inside a CUDA graph needs torch >= 2.6 (register_generator_state)")
                graph.register_generator_state(self.generator)
            with torch.cuda.graph(graph, pool=pool, stream=capture_stream):
                self.decode_step(batch, bucket, greedy)
            self._graphs[(batch, bucket, greedy)] = graph
        for group_size, bucket in prefill_keys:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=capture_stream):
                self._prefill_pass(self._prefill_inputs.view(group_size, bucket))
            self._prefill_graphs[(group_size, bucket)] = graph
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
        if tuple(request.bert_features.shape) != (self.config.bert_feature_dim, text_len):
            raise ValueError(
                f"bert_features {tuple(request.bert_features.shape)} must be "
                f"({self.config.bert_feature_dim}, {text_len}) for {text_len} phonemes"
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
            self._host_steps_left[slot] = request.max_steps - 1  # the prefill makes the first token
            self._host_len[slot] = request.phoneme_ids.shape[0] + (
                0 if request.prompt_tokens is None else request.prompt_tokens.shape[0]
            )
        for start in range(0, len(admitted), self.prefill_batch):
            group = admitted[start : start + self.prefill_batch]
            self.prefill([slot for slot, _ in group], [request for _, request in group])

    def advance(self, num_steps: int) -> None:
        """Run ``num_steps`` decode steps over the occupied slots with no host synchronisation, fewer
        when every occupied request reaches its ``max_steps`` sooner: steps after that would only be
        thrown away (a 500-token request in steps of 16 ran 13 of them)."""
        occupied = self.occupied_slots()
        if not occupied:
            return
        # At least one, so a caller looping until it reads the stop flags never loops on empty calls.
        num_steps = max(1, min(num_steps, max(self._host_steps_left[slot] for slot in occupied)))
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
                self._host_steps_left[slot] -= 1

    def collect(self) -> list[int]:
        """Read the stop flags (one host sync), free the slots of stopped requests, return their ids."""
        # (4, slots) on the host in one transfer: a read per value would sync once per finished row.
        flags = torch.stack([self.done.long(), self.stop_step, self.stop_by_eos.long(), self.max_steps]).cpu()
        stopped = []  # (slot, request id, stop step, stopped by EOS, tokens kept)
        for slot, request_id in enumerate(self._slot_request):
            if request_id is None or not flags[0, slot]:
                continue
            stop_step, by_eos = int(flags[1, slot]), bool(flags[2, slot])
            if by_eos:
                stopped_by = "eos"
            elif stop_step + 1 >= int(flags[3, slot]):
                stopped_by = "max_steps"
            else:
                stopped_by = "early_stop"
            stopped.append((slot, request_id, stop_step, stopped_by, stop_step if by_eos else stop_step + 1))
        if not stopped:
            return []
        rows = torch.tensor([slot for slot, *_ in stopped], device=self.device)
        tokens = self.tokens[rows].cpu()  # (n, OFFICIAL_MAX_STEPS): a copy, the slots are reused
        for row, (slot, request_id, stop_step, stopped_by, kept) in enumerate(stopped):
            self._results[request_id] = T2SResult(
                tokens=tokens[row, :kept].clone(),
                stop_step=stop_step,
                stopped_by=stopped_by,
                reference_free=self._slot_reference_free[slot],
            )
            self._slot_request[slot] = None
        return [request_id for _, request_id, *_ in stopped]

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
