"""Fused Triton kernels for the T2S decode step: five kernels a layer, two around them.

At batch 1 a decode step is launch-bound: the cuBLAS path spends about a dozen kernels a layer
(GEMMs, bias, residual add, LayerNorm, cache write, attention). Here each layer is

    qkv    LayerNorm of the previous sum (prologue) -> x W_qkv^T + b -> q, and k|v into the cache
    attend each (row, head): q against the row's valid keys, online softmax, the weighted values
    out    attention W_o^T + b + the layer's input            -> pre-norm sum 1
    ffn1   LayerNorm 1 of sum 1 (prologue) -> relu(x W_1^T + b_1)
    ffn2   h W_2^T + b_2 + LayerNorm 1 output                 -> pre-norm sum 2

so the residual stream, LayerNorms and accumulation are float32 while the weights and the cache
stay in the engine's dtype. A LayerNorm is recomputed by every program of the next matrix product
(512 numbers a row), which is cheaper than a kernel of its own. One kernel before the layers
embeds each row's token and finds its cache slot; one after them makes the choice (greedy, or
sampling over noise torch draws first) and all of the row's stop bookkeeping. A step is about
5 x layers + 3 kernels instead of about 14 x layers. Batches above ``fused_max_batch`` take the
wide step instead: cuBLAS products and seven kernels a layer.

    engine = TritonT2SEngine(weights, max_batch=1, max_len=640, length_buckets=[640])
    engine.capture_graphs()      # needs CUDA and Triton

Triton is on the GPU machine only; on CPU the kernels run (slowly) under ``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from models.gpt_sovits.engine import T2SEngine, after_attention
from models.gpt_sovits.engine_weights import (
    LAYER_NORM_EPS,
    POSITION_TABLE_LEN,
    T2SWeights,
)


@triton.jit
def _linear_kernel(
    in_ptr, ln_weight_ptr, ln_bias_ptr, normed_ptr, weight_ptr, bias_ptr, residual_ptr, out_ptr,
    cache_ptr, pos_ptr, cache_row_stride, cache_pos_stride,
    rows, n_out,
    K: tl.constexpr, K_PAD: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRO_LN: tl.constexpr, WRITE_NORMED: tl.constexpr, HAS_BIAS: tl.constexpr, RELU: tl.constexpr,
    ADD_RESIDUAL: tl.constexpr, TO_CACHE: tl.constexpr, EPS: tl.constexpr,
    DOT: tl.constexpr = False, DOT_IEEE: tl.constexpr = False,
):
    """out[b, n] = f(x[b]) . W[n] (+ bias, relu, residual); x[b] is LayerNorm(in[b]) when PRO_LN.
    With TO_CACHE, columns >= SPLIT go to cache[b, pos[b], n - SPLIT] instead of out.

    DOT: the product on tensor cores (``tl.dot``, the activations rounded to the weights' dtype as
    the cuBLAS step does; DOT_IEEE keeps float32 weights' products in full float32), for row
    blocks of 16 to 64; the LayerNorm statistics are then gathered chunk by chunk, since a whole
    64-row block of activations would not fit in registers."""
    # Row blocks vary fastest, so the programs that share a weight tile run side by side (L2 hits).
    row = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    pid = tl.program_id(1)
    row_ok = row < rows
    col = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = col < n_out
    if PRO_LN and DOT:
        total = tl.zeros((BLOCK_B,), dtype=tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            chunk_ok = row_ok[:, None] & (k < K)[None, :]
            total += tl.sum(tl.load(in_ptr + row[:, None] * K + k[None, :], mask=chunk_ok, other=0.0), axis=1)
        mean = total / K
        spread = tl.zeros((BLOCK_B,), dtype=tl.float32)
        for k0 in tl.static_range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            chunk_ok = row_ok[:, None] & (k < K)[None, :]
            chunk = tl.load(in_ptr + row[:, None] * K + k[None, :], mask=chunk_ok, other=0.0)
            centred = tl.where(chunk_ok, chunk - mean[:, None], 0.0)
            spread += tl.sum(centred * centred, axis=1)
        rstd = 1.0 / tl.sqrt(spread / K + EPS)
    elif PRO_LN:
        full = tl.arange(0, K_PAD)
        full_ok = row_ok[:, None] & (full < K)[None, :]
        values = tl.load(in_ptr + row[:, None] * K + full[None, :], mask=full_ok, other=0.0)
        mean = tl.sum(values, axis=1) / K
        centred = tl.where(full_ok, values - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / K + EPS)
    acc = tl.zeros((BLOCK_B, BLOCK_N), dtype=tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x_ok = row_ok[:, None] & k_ok[None, :]
        x = tl.load(in_ptr + row[:, None] * K + k[None, :], mask=x_ok, other=0.0)
        if PRO_LN:
            gamma = tl.load(ln_weight_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            beta = tl.load(ln_bias_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            x = tl.where(x_ok, (x - mean[:, None]) * rstd[:, None] * gamma[None, :] + beta[None, :], 0.0)
        if WRITE_NORMED:  # noqa: SIM102 - a compile-time switch around a run-time test
            if pid == 0:
                tl.store(normed_ptr + row[:, None] * K + k[None, :], x, mask=x_ok)
        w = tl.load(weight_ptr + col[:, None] * K + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT:
            if DOT_IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")  # (BLOCK_B, BLOCK_N)
            else:
                acc += tl.dot(x.to(w.dtype), tl.trans(w))
        else:
            acc += tl.sum(x[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)  # (BLOCK_B, BLOCK_N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + col, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if RELU:
        acc = tl.maximum(acc, 0.0)
    out_ok = row_ok[:, None] & col_ok[None, :]
    if ADD_RESIDUAL:
        acc += tl.load(residual_ptr + row[:, None] * n_out + col[None, :], mask=out_ok, other=0.0)
    if TO_CACHE:
        if pid * BLOCK_N >= SPLIT:
            pos = tl.load(pos_ptr + row, mask=row_ok, other=0)
            target = cache_ptr + row[:, None] * cache_row_stride + pos[:, None] * cache_pos_stride + (col - SPLIT)[None, :]
            tl.store(target, acc.to(cache_ptr.dtype.element_ty), mask=out_ok)
        else:
            tl.store(out_ptr + row[:, None] * SPLIT + col[None, :], acc, mask=out_ok)
    else:
        tl.store(out_ptr + row[:, None] * n_out + col[None, :], acc, mask=out_ok)


@triton.jit
def _attention_kernel(
    q_ptr, cache_ptr, valid_ptr, out_ptr, cache_row_stride, cache_pos_stride, scale,
    D_MODEL: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_L: tl.constexpr,
    MAX_LEN: tl.constexpr, FROM_QKV: tl.constexpr = False,
):
    """One (row, head): softmax(q k^T / sqrt(Dh)) v over the row's valid cache positions.

    ``FROM_QKV``: ``q_ptr`` is the (B, 3d) product q | k | v, and the program first writes its
    head's new key and value into the cache at the row's last valid position (the wide step's
    cache write and q copy, folded in); else ``q_ptr`` is (B, d) and the cache already holds them."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    dim = tl.arange(0, HEAD_PAD)
    dim_ok = dim < HEAD_DIM
    q_row = q_ptr + b * (3 * D_MODEL if FROM_QKV else D_MODEL) + h * HEAD_DIM
    q = tl.load(q_row + dim, mask=dim_ok, other=0.0).to(tl.float32) * scale
    valid = tl.load(valid_ptr + b)
    base = cache_ptr + b * cache_row_stride + h * HEAD_DIM
    if FROM_QKV:
        new = base + (valid - 1) * cache_pos_stride + dim
        tl.store(new, tl.load(q_row + D_MODEL + dim, mask=dim_ok), mask=dim_ok)
        tl.store(new + D_MODEL, tl.load(q_row + 2 * D_MODEL + dim, mask=dim_ok), mask=dim_ok)
        tl.debug_barrier()  # the program's threads read what the others just wrote
    best = tl.zeros((1,), dtype=tl.float32) - float("inf")  # (1,): a loop-carried running maximum
    total = tl.zeros((1,), dtype=tl.float32)
    acc = tl.zeros((HEAD_PAD,), dtype=tl.float32)
    # A fixed trip count with a skip past the valid length (not a loop bound read from memory:
    # Triton's CPU interpreter, which the tests use, cannot take one).
    for start in range(0, MAX_LEN, BLOCK_L):
        if start < valid:
            pos = start + tl.arange(0, BLOCK_L)
            pos_ok = pos < valid
            tile_ok = pos_ok[:, None] & dim_ok[None, :]
            keys = tl.load(base + pos[:, None] * cache_pos_stride + dim[None, :], mask=tile_ok, other=0.0)
            scores = tl.where(pos_ok, tl.sum(keys.to(tl.float32) * q[None, :], axis=1), float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=0))
            weights = tl.exp(scores - new_best)
            rescale = tl.exp(best - new_best)
            values = tl.load(base + D_MODEL + pos[:, None] * cache_pos_stride + dim[None, :], mask=tile_ok, other=0.0)
            acc = acc * rescale + tl.sum(weights[:, None] * values.to(tl.float32), axis=0)
            total = total * rescale + tl.sum(weights, axis=0)
            best = new_best
    tl.store(out_ptr + b * D_MODEL + h * HEAD_DIM + dim, acc / total, mask=dim_ok)


@triton.jit
def row_layer_norm(values, ok, weight_ptr, bias_ptr, dim, D: tl.constexpr, EPS: tl.constexpr):
    """LayerNorm of one (D_PAD,) float32 row whose padding is masked by ``ok``."""
    gamma = tl.load(weight_ptr + dim, mask=ok, other=0.0).to(tl.float32)
    beta = tl.load(bias_ptr + dim, mask=ok, other=0.0).to(tl.float32)
    return layer_norm_with(values, ok, gamma, beta, D, EPS)


@triton.jit
def layer_norm_with(values, ok, gamma, beta, D: tl.constexpr, EPS: tl.constexpr):
    """LayerNorm of one (D_PAD,) float32 row whose padding is masked by ``ok``, with its scale
    ``gamma`` and shift ``beta`` (D_PAD,) float32 already loaded: a caller on a latency-bound path
    loads them early, since a load placed after the row's two reductions waits a memory round trip
    behind them."""
    mean = tl.sum(values, axis=0) / D
    centred = tl.where(ok, values - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / D + EPS)
    return tl.where(ok, centred * rstd * gamma + beta, 0.0)


@triton.jit
def _add_layer_norm_kernel(
    x_ptr, y_ptr, weight_ptr, bias_ptr, out_ptr, EPS: tl.constexpr, D_MODEL: tl.constexpr, D_PAD: tl.constexpr,
):
    """Row b: LayerNorm(x + y), the sum rounded to the inputs' dtype first as torch's add would."""
    b = tl.program_id(0)
    dim = tl.arange(0, D_PAD)
    dim_ok = dim < D_MODEL
    x = tl.load(x_ptr + b * D_MODEL + dim, mask=dim_ok, other=0.0)
    total = (x.to(tl.float32) + tl.load(y_ptr + b * D_MODEL + dim, mask=dim_ok, other=0.0).to(tl.float32))
    normed = row_layer_norm(total.to(x.dtype).to(tl.float32), dim_ok, weight_ptr, bias_ptr, dim, D_MODEL, EPS)
    tl.store(out_ptr + b * D_MODEL + dim, normed.to(x.dtype), mask=dim_ok)


@triton.jit
def _prepare_kernel(
    last_token_ptr, audio_pos_ptr, cache_len_ptr, embedding_ptr, positions_ptr, x_ptr, write_pos_ptr, valid_ptr,
    MAX_LEN: tl.constexpr, MAX_POSITION: tl.constexpr, D_MODEL: tl.constexpr, D_PAD: tl.constexpr,
):
    """Row b: the cache slot its new key goes to, its valid length, and its input embedding."""
    b = tl.program_id(0)
    write_pos = tl.minimum(tl.load(cache_len_ptr + b), MAX_LEN - 1)
    tl.store(write_pos_ptr + b, write_pos)
    tl.store(valid_ptr + b, write_pos + 1)
    token = tl.load(last_token_ptr + b)
    position = tl.minimum(tl.load(audio_pos_ptr + b), MAX_POSITION - 1)
    dim = tl.arange(0, D_PAD)
    dim_ok = dim < D_MODEL
    x = tl.load(embedding_ptr + token * D_MODEL + dim, mask=dim_ok, other=0.0).to(tl.float32)
    x += tl.load(positions_ptr + position * D_MODEL + dim, mask=dim_ok, other=0.0).to(tl.float32)
    tl.store(x_ptr + b * D_MODEL + dim, x, mask=dim_ok)


@triton.jit
def _choose_record_kernel(
    logits_ptr, race_ptr, seen_ptr, penalty_ptr, eos_from_step_ptr, top_k_ptr, top_p_ptr, temperature_ptr,
    step_ptr, early_stop_ptr, max_steps_ptr, done_ptr, stop_step_ptr, stop_by_eos_ptr, tokens_ptr, last_token_ptr,
    cache_len_ptr, audio_pos_ptr,
    TOKENS_CAP: tl.constexpr, VOCAB: tl.constexpr, VOCAB_PAD: tl.constexpr, EOS: tl.constexpr, SAMPLE: tl.constexpr,
):
    """Row b: ``engine_sampling.choose_tokens`` (EOS block, penalty; greedy: the argmax; ``SAMPLE``:
    nucleus, temperature, top-k, softmax and the exponential race over ``race``, the noise torch
    drew from the engine's generator) and the engine's stop bookkeeping
    (``T2SEngine._choose_and_record`` plus the position advance) in one program.

    The nucleus and top-k cuts are applied by value (an id is cut when its score is below the last
    kept one), where the torch sampler cuts positions of its sort, and the softmax and cumulative
    sums add in another order: the two can differ for ids tied at a cut, for a cumulative sum within
    rounding of top-p, and for near-ties of the race."""
    b = tl.program_id(0)
    vocab = tl.arange(0, VOCAB_PAD)
    vocab_ok = vocab < VOCAB
    logits = tl.load(logits_ptr + b * VOCAB + vocab, mask=vocab_ok, other=float("-inf"))
    step = tl.load(step_ptr + b)
    logits = tl.where((vocab == EOS) & (step < tl.load(eos_from_step_ptr + b)), float("-inf"), logits)
    penalty = tl.load(penalty_ptr + b)
    seen = tl.load(seen_ptr + b * VOCAB + vocab, mask=vocab_ok, other=0) != 0
    penalised = tl.where(logits < 0, logits * penalty, logits / penalty)
    scores = tl.where(seen, penalised, logits)
    best = tl.argmax(scores, axis=0).to(tl.int64)
    if SAMPLE:
        ranked = tl.sort(scores, descending=True)  # (VOCAB_PAD,): padding (-inf) last
        probabilities = tl.exp(ranked - tl.max(ranked, axis=0))
        cumulative = tl.cumsum(probabilities / tl.sum(probabilities, axis=0), axis=0)
        # A vector, not a scalar: a scalar condition and'ed into a block mask trips the interpreter.
        top_p = tl.zeros((VOCAB_PAD,), dtype=tl.float32) + tl.load(top_p_ptr + b)
        cut = (cumulative > top_p) & (top_p < 1.0) & (vocab > 0)  # the best id always stays
        temperature = tl.maximum(tl.load(temperature_ptr + b), 1e-5)
        ranked_tempered = tl.where(cut, float("-inf"), ranked) / temperature
        k = tl.minimum(tl.maximum(tl.load(top_k_ptr + b), 1), VOCAB) - 1
        pivot = tl.max(tl.where(vocab == k, ranked_tempered, float("-inf")), axis=0)  # the k-th largest kept
        last_kept = tl.min(tl.where(cut | ~vocab_ok, float("inf"), ranked), axis=0)
        tempered = tl.where(scores < last_kept, float("-inf"), scores) / temperature
        tempered = tl.where(tempered < pivot, float("-inf"), tempered)
        weights = tl.exp(tempered - tl.max(tempered, axis=0))
        race = tl.load(race_ptr + b * VOCAB + vocab, mask=vocab_ok, other=1.0)
        token = tl.argmax(tl.where(vocab_ok, (weights / tl.sum(weights, axis=0)) / race, -1.0), axis=0).to(tl.int64)
        by_eos = (token == EOS) | (best == EOS)
    else:
        token = best
        by_eos = token == EOS
    early_stop = tl.load(early_stop_ptr + b)
    stopping = (tl.load(done_ptr + b) == 0) & (by_eos | ((early_stop >= 0) & (step + 1 > early_stop))
                                             | (step >= tl.load(max_steps_ptr + b) - 1))
    if stopping:
        tl.store(stop_step_ptr + b, step)
        tl.store(stop_by_eos_ptr + b, by_eos.to(tl.int1))
        tl.store(done_ptr + b, 1)
    tl.store(tokens_ptr + b * TOKENS_CAP + tl.minimum(step, TOKENS_CAP - 1), token)
    tl.store(seen_ptr + b * VOCAB + token, 1)
    tl.store(last_token_ptr + b, token)
    tl.store(step_ptr + b, step + 1)
    tl.store(cache_len_ptr + b, tl.load(cache_len_ptr + b) + 1)
    tl.store(audio_pos_ptr + b, tl.load(audio_pos_ptr + b) + 1)


def _pow2_at_most(value: int) -> int:
    return 1 << (max(value, 1).bit_length() - 1)


class TritonT2SEngine(T2SEngine):
    """``T2SEngine`` whose decode step runs the fused kernels.

    Knobs (the benchmark sweeps them on the machine; the defaults are the H200's best):
    ``linear_programs``, about how many programs each matrix product spreads over; ``num_warps``
    per program; ``attention_block``, keys per attention iteration. Batches above ``fused_max_batch`` run cuBLAS
    products with the attention kernel (``_wide_step``): the fused products re-read each weight tile
    per 8 rows, and on the H200 they lost at 64 rows (11,400 vs 37,900 tokens/s for the cuBLAS
    step) while winning at 1 (1,950 vs 960).

    ``dot_min_batch``: from this many rows on, the fused products run on tensor cores (``DOT`` in
    ``_linear_kernel``: one program per ``dot_block_n`` output columns and up to 64 rows, so each
    weight tile is read once per 64 rows rather than once per 8); it applies to batches up to
    ``fused_max_batch``, so ``fused_max_batch=64, dot_min_batch=16`` runs a 64-row step as five
    fused kernels a layer instead of about eleven cuBLAS and elementwise ones. Opt-in: on the H200
    that step made 24,800-28,300 tokens/s with every slot full (16-column tiles the fastest)
    against 45,600 for the cuBLAS step (docs/benchmarks.md), too few programs a product.

    ``fused_wide_step=False``: the wide step as it was before its cache write, q copy and residual
    adds were folded into our kernels (eleven kernels a layer instead of seven), kept to measure the
    two side by side."""

    def __init__(self, weights: T2SWeights, *args, linear_programs: int = 256, num_warps: int = 4,
                 attention_block: int = 128, fused_max_batch: int = 8, dot_min_batch: int = 16,
                 dot_block_n: int = 32, fused_wide_step: bool = True, **kwargs):
        super().__init__(weights, *args, **kwargs)
        if dot_block_n < 16 or dot_block_n & (dot_block_n - 1):
            raise ValueError(f"dot_block_n {dot_block_n} must be a power of two >= 16 (tl.dot's smallest tile)")
        # The q | k,v split of the first product falls between tiles of at least 16 columns.
        if dot_min_batch <= min(self.max_batch, fused_max_batch) and self.config.hidden_dim % 16:
            raise ValueError(f"the tensor-core products need hidden_dim {self.config.hidden_dim} to be a multiple "
                             f"of 16: raise dot_min_batch above {min(self.max_batch, fused_max_batch)}")
        self.fused_max_batch = fused_max_batch
        self.fused_wide_step = fused_wide_step
        self.dot_min_batch = dot_min_batch
        self.dot_block_n = dot_block_n
        self.linear_programs = linear_programs
        self.num_warps = num_warps
        self.attention_block = attention_block
        rows, d, ffn = min(self.max_batch, fused_max_batch), self.config.hidden_dim, self.config.ffn_dim

        def buffer(width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(rows, width, dtype=dtype, device=self.device)

        # Static activations of the fused step (graph-safe: allocated once), float32.
        self._x0, self._q, self._attention, self._normed_a, self._normed_b = (buffer(d) for _ in range(5))
        self._sum1, self._sum2, self._hidden = buffer(d), buffer(d), buffer(ffn)
        self._logits = buffer(self.config.vocab_size)
        self._write_pos, self._valid = torch.zeros(rows, dtype=torch.int64, device=self.device), torch.zeros(
            rows, dtype=torch.int64, device=self.device)

    def _linear(self, batch: int, source: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, *,
                bias: torch.Tensor | None = None, norm: tuple[torch.Tensor, torch.Tensor] | None = None,
                normed: torch.Tensor | None = None, relu: bool = False, residual: torch.Tensor | None = None,
                cache: torch.Tensor | None = None) -> None:
        n_out, k = weight.shape
        k_pad = triton.next_power_of_2(k)
        split = self.config.hidden_dim if cache is not None else n_out
        dot = batch >= self.dot_min_batch
        if dot:  # tl.dot tiles are at least 16 x 16 x 16; masked rows and columns cost nothing
            block_b = min(max(triton.next_power_of_2(batch), 16), 64)
            block_n = self.dot_block_n
            while cache is not None and split % block_n and block_n > 16:  # a tile may not straddle q | kv
                block_n //= 2
            if cache is not None and split % block_n:
                raise ValueError(f"the tensor-core products split {split} columns, not a multiple of 16")
            block_k = 64
        else:
            block_b = min(triton.next_power_of_2(batch), 8)  # more rows a program would spill registers
            block_n = min(32, max(4, _pow2_at_most(n_out // self.linear_programs)))
            while split % block_n:
                block_n //= 2
            block_k = min(k_pad, max(32, 8192 // (block_b * block_n)))
        dummy = source
        grid = (triton.cdiv(batch, block_b), triton.cdiv(n_out, block_n))
        _linear_kernel[grid](
            source, norm[0] if norm else dummy, norm[1] if norm else dummy, normed if normed is not None else dummy,
            weight, bias if bias is not None else dummy, residual if residual is not None else dummy, out,
            cache if cache is not None else dummy, self._write_pos,
            cache.stride(0) if cache is not None else 0, cache.stride(1) if cache is not None else 0,
            batch, n_out,
            K=k, K_PAD=k_pad, SPLIT=split, BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k,
            PRO_LN=norm is not None, WRITE_NORMED=normed is not None, HAS_BIAS=bias is not None, RELU=relu,
            ADD_RESIDUAL=residual is not None, TO_CACHE=cache is not None, EPS=LAYER_NORM_EPS,
            DOT=dot, DOT_IEEE=dot and weight.dtype == torch.float32, num_warps=self.num_warps,
        )

    @torch.no_grad()
    def _wide_step(self, batch: int, greedy: bool) -> None:
        """The step for batches above ``fused_max_batch``: cuBLAS matrix products (each weight read
        once for all rows) and three kernels of ours a layer: attention over each row's valid keys
        that also writes the new key and value into the cache (the cuBLAS step's attention reads the
        whole length bucket, padding included), and residual add + LayerNorm twice. Seven kernels a
        layer instead of eleven: at 64 rows the step is short enough for launches to count."""
        w, config = self.weights, self.config
        d, heads = config.hidden_dim, config.num_heads
        rows = slice(0, batch)
        valid = self.cache_len[rows].clamp(max=self.max_len - 1) + 1  # (B,): the new key included
        x = w.audio_embedding[self.last_token[rows]] + w.audio_positions[self.audio_pos[rows].clamp(max=POSITION_TABLE_LEN - 1)]
        for layer, cache in zip(w.layers, self.kv_cache):  # cache: (slots, max_len, 2d)
            qkv = torch.addmm(layer.qkv_bias, x, layer.qkv_weight.t())  # (B, 3d)
            attention = torch.empty(batch, d, dtype=w.dtype, device=self.device)
            if not self.fused_wide_step:
                cache.index_put_((self._slot_ids[rows], valid - 1), qkv[:, d:])
            _attention_kernel[(batch, heads)](
                qkv if self.fused_wide_step else qkv[:, :d].contiguous(), cache, valid, attention, cache.stride(0),
                cache.stride(1), 1.0 / math.sqrt(config.head_dim),
                D_MODEL=d, HEAD_DIM=config.head_dim, HEAD_PAD=triton.next_power_of_2(config.head_dim),
                BLOCK_L=self.attention_block, MAX_LEN=self.max_len, FROM_QKV=self.fused_wide_step,
                num_warps=self.num_warps,
            )
            if not self.fused_wide_step:
                x = after_attention(x, attention, layer)
                continue
            x = self._add_layer_norm(x, torch.addmm(layer.out_bias, attention, layer.out_weight.t()),
                                     layer.norm1_weight, layer.norm1_bias)
            hidden = torch._addmm_activation(layer.ffn1_bias, x, layer.ffn1_weight.t())  # relu fused in the GEMM
            x = self._add_layer_norm(x, torch.addmm(layer.ffn2_bias, hidden, layer.ffn2_weight.t()),
                                     layer.norm2_weight, layer.norm2_bias)
        self._record(batch, (x @ w.predict_weight.t()).float(), greedy)  # (B, V) logits

    def _add_layer_norm(self, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor) -> torch.Tensor:
        """(B, d) LayerNorm(x + y) in one kernel."""
        out = torch.empty_like(x)
        d = self.config.hidden_dim
        _add_layer_norm_kernel[(x.shape[0],)](x, y, weight, bias, out, EPS=LAYER_NORM_EPS, D_MODEL=d,
                                              D_PAD=triton.next_power_of_2(d))
        return out

    def _record(self, batch: int, logits: torch.Tensor, greedy: bool) -> None:
        """Choose and record each row's token in one kernel; sampling draws its noise first, as the
        torch sampler does (one draw of the batch's shape from the engine's generator)."""
        vocab = self.config.vocab_size
        race = logits if greedy else torch.empty_like(logits).exponential_(1.0, generator=self.generator)  # (B, V)
        sampling = self.sampling
        _choose_record_kernel[(batch,)](
            logits, race, self.seen, sampling.repetition_penalty, sampling.eos_from_step, sampling.top_k,
            sampling.top_p, sampling.temperature, self.step, self.early_stop, self.max_steps, self.done,
            self.stop_step, self.stop_by_eos, self.tokens, self.last_token, self.cache_len, self.audio_pos,
            TOKENS_CAP=self.tokens.shape[1], VOCAB=vocab, VOCAB_PAD=triton.next_power_of_2(vocab),
            EOS=self.config.eos_id, SAMPLE=not greedy,
        )

    @torch.no_grad()
    def decode_step(self, batch: int, cache_bucket: int, greedy: bool) -> None:
        """The fused step: attention reads each row's valid keys, so ``cache_bucket`` is not used."""
        if batch > self.fused_max_batch:
            self._wide_step(batch, greedy)
            return
        w, config = self.weights, self.config
        d, heads = config.hidden_dim, config.num_heads
        rows = slice(0, batch)
        _prepare_kernel[(batch,)](
            self.last_token, self.audio_pos, self.cache_len, w.audio_embedding, w.audio_positions, self._x0,
            self._write_pos, self._valid,
            MAX_LEN=self.max_len, MAX_POSITION=POSITION_TABLE_LEN, D_MODEL=d, D_PAD=triton.next_power_of_2(d),
        )
        source, norm = self._x0, None
        for index, layer in enumerate(w.layers):
            cache = self.kv_cache[index]  # (slots, max_len, 2d)
            self._linear(batch, source, layer.qkv_weight, self._q, bias=layer.qkv_bias, norm=norm,
                         normed=self._normed_a, cache=cache)
            _attention_kernel[(batch, heads)](
                self._q, cache, self._valid, self._attention, cache.stride(0), cache.stride(1),
                1.0 / math.sqrt(config.head_dim),
                D_MODEL=d, HEAD_DIM=config.head_dim, HEAD_PAD=triton.next_power_of_2(config.head_dim),
                BLOCK_L=self.attention_block, MAX_LEN=self.max_len, num_warps=self.num_warps,
            )
            self._linear(batch, self._attention, layer.out_weight, self._sum1, bias=layer.out_bias,
                         residual=self._normed_a)
            self._linear(batch, self._sum1, layer.ffn1_weight, self._hidden, bias=layer.ffn1_bias,
                         norm=(layer.norm1_weight, layer.norm1_bias), normed=self._normed_b, relu=True)
            self._linear(batch, self._hidden, layer.ffn2_weight, self._sum2, bias=layer.ffn2_bias,
                         residual=self._normed_b)
            source, norm = self._sum2, (layer.norm2_weight, layer.norm2_bias)
        logits = self._logits[rows]
        self._linear(batch, source, w.predict_weight, logits, norm=norm)
        self._record(batch, logits, greedy)
