"""The T2S decode step at batch 1 as one persistent Triton kernel: every layer in one launch.

At batch 1 the decode step moves about 150 MB of FP16 weights, which an H200 reads in ~31 us;
what costs is latency: the five-kernels-a-layer step (``engine_triton``) spends ~0.5 ms on 123
kernels, each waiting for its inputs from memory and for the previous kernel to drain. Here one
launch of ``programs`` (<= one per SM, all resident at once) walks the 24 layers, with a grid-wide
barrier between the phases that need the whole previous result:

    attend  every program: LayerNorm 2 of the previous layer's sum (or the embedding at layer 0);
            (head, chunk) programs: q of their head, softmax partials over their chunk of the
            cached positions; per head, one program makes the new token's k (into the cache,
            and its score) and one its v: the new position's partial
    out     combine the partials per head, W_o, bias, + the layer's input     -> sum 1
    ffn1    LayerNorm 1 of sum 1, relu(W_1 . + b_1)                          -> hidden
    ffn2    W_2 hidden + b_2 + LayerNorm 1 output                            -> sum 2
    (after the last layer) logits = W_p LayerNorm 2(sum 2)

so four barriers a layer unfolded, two with both folds below. Each program issues the load of its
next weight tile *before* it waits at a barrier: weights never depend on the step, so their memory
latency hides behind the wait, and after the barrier only activations (in L2, written a phase ago)
are on the critical path. With ``arrive_first`` (on by default) it arrives at the barrier before it
issues those loads: issuing a 32-64 KB tile stalls a program for about 0.6 us, and before an arrival
that stall delays every program; the arrival's release then also waits on no tile load.

``fold_ffn`` (on by default) makes the two FFN phases one: each program takes
a slice of the hidden units, relu(W_1 . + b_1) for them, then their columns of W_2 times that
slice: a partial of sum 2 that it adds into the layer's row of sum 2 with float atomics. Three
barriers a layer instead of four; the price is that the order of the additions, so the last bits
of sum 2 in float32, varies from run to run.

``fold_out`` (on by default) removes the out phase: the program of a head that
arrives last at that head's counter (an atomic add with acquire-release order, after its own
partial is written) combines the head's partials, multiplies them by the head's columns of W_o and
adds the product into the layer's row of sum 1 with float atomics (the lead head adds the bias and
the layer input too). No program waits for another there, so a layer loses a barrier; sum 1 then
varies in its last float32 bits from run to run, as sum 2 does under ``fold_ffn``.

On the H200 (full-size random weights, 500 greedy FP16 tokens, one call, scripts/sweep_t2s_persistent.py),
tokens per second at 132 programs: 2,466 with four barriers a layer, 2,657 with ``fold_ffn``, 3,361
with both folds (128 programs: 2,468, 2,626, 3,263); every row's tokens equal the fused FP16 step's
(docs/results/h200_33_t2s_folds.json). Where a folded step's time goes was then read from the
kernel's own timer (``timeline=True``, models/gpt_sovits/step_timeline.py; an H100, one call,
docs/results/h100_36_t2s_timeline.json): an attend phase spans 8.7 us (2.1 of them before its barrier
releases: the FFN's float atomics and the tile loads ahead of the arrival), an FFN phase 3.2 us
(0.86 before release). The defaults since (an H100, one call, docs/results/h100_36_t2s_arrive_first.json):
W_o kept in L2 (``out_in_l2``) 3,431 tokens/s, with ``arrive_first`` 3,772, and with the folded sums
in 8 replicas too 3,995; every row's tokens equal the fused FP16 step's.

A barrier is a counter in global memory: each program adds one (release) and polls until the
counter reaches ``phase x programs`` (acquire). That needs every program resident at once, so the
grid is at most the SM count; a poll that passes ``SPIN_LIMIT`` gives up and raises an error flag
instead of hanging the GPU (``barrier_timed_out`` reads it). Activations written inside the kernel
are read with ``.cg`` loads (L2, not a possibly stale L1 line).

Under ``TRITON_INTERPRET=1`` (CPU tests) programs run one after another and a barrier could never
be met, so the engine launches one phase of one layer at a time instead (``phased=True``): the same
phase code, the kernel boundary as the barrier.

    engine = PersistentT2SEngine(weights, max_batch=1, max_len=640, length_buckets=[640])
    engine.capture_graphs()          # GPU: memset of the barrier, the step kernel, the choice kernel
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from models.gpt_sovits.engine_triton import TritonT2SEngine, layer_norm_with
from models.gpt_sovits.engine_weights import (
    LAYER_NORM_EPS,
    POSITION_TABLE_LEN,
    T2SWeights,
)
from models.gpt_sovits.step_timeline import StepLayout

# One program per SM of an H200 or H100 SXM: with both folds 3,361 tokens/s against 3,263 on 128
# (docs/results/h200_33_t2s_folds.json). A GPU with fewer SMs takes one per SM.
DEFAULT_PROGRAMS = 132
# Each folded sum row kept as 8 rows that the programs add into in turn: with arrive_first, 4,006 tokens/s
# on an H100 against 3,772 with one row and 3,852 with 16 (docs/results/h100_36_t2s_arrive_first.json,
# h100_36_t2s_replicas.json).
DEFAULT_SUM_REPLICAS = 8
SPIN_LIMIT = tl.constexpr(1 << 24)  # polls before a barrier gives up: far beyond any real wait (~1 us)
PHASE_ATTEND, PHASE_OUT, PHASE_FFN1, PHASE_FFN2, PHASE_LOGITS, PHASE_FFN, PHASE_HEAD_OUT = 0, 1, 2, 3, 4, 5, 6
PERSISTENT = -1


def _barrier_ptx(arrive: bool, poll: str | None, after: str = "") -> str:
    """Thread 0's part of a grid barrier as inline PTX: ``$1`` the counter, ``$2`` the target, ``$3``
    the poll limit, ``$0`` the count last seen (the target where it does not poll). ``arrive``: add
    its arrival (a fire-and-forget release add); ``poll``: the load instruction that polls until the
    count is reached, None for no wait; ``after``: what runs once it is reached."""
    arrival = "red.release.gpu.global.add.u32 [$1], 1;" if arrive else ""
    wait = "" if poll is None else f"""
    mov.u32 n, 0;
    WAIT:
    {poll} $0, [$1];
    add.u32 n, n, 1;
    setp.ge.u32 p_give, n, $3;
    @p_give bra.uni DONE;
    setp.lt.u32 p_wait, $0, $2;
    @p_wait bra.uni WAIT;
    {after}"""
    return f"""
    {{
    .reg .pred p_lead, p_wait, p_give;
    .reg .u32 t, n;
    mov.u32 $0, $2;
    mov.u32 t, %tid.x;
    setp.eq.u32 p_lead, t, 0;
    @!p_lead bra.uni DONE;
    {arrival}{wait}
    DONE:
    }}
    """


# ASM_BARRIER bits: PTX (else Triton atomics), relaxed polls and one fence (no poll carries the
# acquire's cost), arrival before the next phase's tile loads (_grid_arrive). The kernels test the
# bits as literals (a plain int global cannot enter a Triton function): & 2 relaxed, & 4 arrive-first.
ASM_PTX, ASM_RELAXED, ASM_ARRIVE_FIRST = 1, 2, 4
_ARRIVE = tl.constexpr(_barrier_ptx(True, None))
_ACQUIRE_POLLS = tl.constexpr(_barrier_ptx(True, "ld.acquire.gpu.global.u32"))
_RELAXED_POLLS = tl.constexpr(_barrier_ptx(True, "ld.relaxed.gpu.global.u32", "fence.acq_rel.gpu;"))
_ACQUIRE_WAIT = tl.constexpr(_barrier_ptx(False, "ld.acquire.gpu.global.u32"))
_RELAXED_WAIT = tl.constexpr(_barrier_ptx(False, "ld.relaxed.gpu.global.u32", "fence.acq_rel.gpu;"))


@triton.jit
def _grid_arrive(counter_ptr, target, SYNC: tl.constexpr, ASM: tl.constexpr, timeline_ptr, TIMELINE: tl.constexpr):
    """With SYNC and ASM's arrive-first bit: this program's arrival at grid barrier target / programs,
    made before the phase issues its weight-tile loads, so their issue stalls delay no other program;
    ``_grid_barrier`` then only waits. Otherwise nothing."""
    if SYNC:
        if (ASM & 4) != 0:
            _stamp(timeline_ptr, 2 * (target // tl.num_programs(0) - 1), TIMELINE)
            tl.debug_barrier()  # the whole program's stores before its arrival
            _thread0_ptx(counter_ptr, target, _ARRIVE)


@triton.jit
def _thread0_ptx(counter_ptr, target, PTX: tl.constexpr):
    """Run a ``_barrier_ptx`` block on ``counter_ptr`` and ``target``: the count its thread 0 last saw."""
    return tl.inline_asm_elementwise(PTX, "=r,l,r,r", [counter_ptr, target.to(tl.int32),
                                                       tl.full((), SPIN_LIMIT, tl.int32)],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _grid_barrier(counter_ptr, error_ptr, target, SYNC: tl.constexpr, ASM: tl.constexpr, timeline_ptr,
                  TIMELINE: tl.constexpr):
    """Wait until every program has arrived ``target / programs`` times (SYNC False: no-op). ASM: 0
    Triton atomics; else inline PTX (ASM_PTX), whose polls are relaxed loads and one acquire fence
    with ASM_RELAXED (acquire loads without), and whose arrival ``_grid_arrive`` made already with
    ASM_ARRIVE_FIRST. TIMELINE: stamp the arrival and the release of grid barrier n = target /
    programs as events 2(n - 1) and 2(n - 1) + 1 (``_stamp``)."""
    if SYNC:
        barrier = target // tl.num_programs(0)
        if (ASM & 4) == 0:
            _stamp(timeline_ptr, 2 * (barrier - 1), TIMELINE)
            tl.debug_barrier()  # the whole program's stores before its arrival
        if ASM:
            # Thread 0 alone: a fire-and-forget release add (unless made already), then polls until the
            # count is reached (or SPIN_LIMIT polls); the other threads wait for it at the closing barrier.
            if (ASM & 4) != 0:
                if (ASM & 2) != 0:
                    seen = _thread0_ptx(counter_ptr, target, _RELAXED_WAIT)
                else:
                    seen = _thread0_ptx(counter_ptr, target, _ACQUIRE_WAIT)
            elif (ASM & 2) != 0:
                seen = _thread0_ptx(counter_ptr, target, _RELAXED_POLLS)
            else:
                seen = _thread0_ptx(counter_ptr, target, _ACQUIRE_POLLS)
        else:
            tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
            seen = tl.load(counter_ptr, volatile=True)
            spins = 0
            while (seen < target) & (spins < SPIN_LIMIT):
                seen = tl.load(counter_ptr, volatile=True)
                spins += 1
            tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        if seen < target:
            tl.atomic_max(error_ptr, 1)
        tl.debug_barrier()
        _stamp(timeline_ptr, 2 * (barrier - 1) + 1, TIMELINE)


@triton.jit
def _prefetch_lines(pointers, ok, fallback):
    """Ask L2 for the 128-byte lines at ``pointers`` where ``ok`` (elsewhere the line of the valid
    pointer ``fallback``): no register waits for them, so a tile asked for a phase early is an L2 hit
    when its program loads it before the next barrier."""
    safe = tl.where(ok, pointers, fallback)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l", [safe], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _prefetch_attend_tile(pid, layer, qkv_w_ptr, cache_ptr, cache_layer_stride, cache_len_ptr, D: tl.constexpr,
                          D_PAD: tl.constexpr, H: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr,
                          CHUNKS: tl.constexpr, BLOCK_L: tl.constexpr, MAX_LEN: tl.constexpr):
    """L2 lines of what ``_attend_phase`` of ``layer`` loads before its barrier: the program's W_qkv
    rows (both tiles of a key program) and its chunk's first block of cached keys and values."""
    is_chunk, is_key, is_value, head, rank = _program_role(pid, H, CHUNKS)
    j = tl.arange(0, HD_PAD)
    line = tl.arange(0, (D_PAD + 63) // 64) * 64  # fp16 elements a 128-byte line apart (at least one line)
    has_role = (j * 0 + pid) < H * CHUNKS + 2 * H
    w_base = qkv_w_ptr + layer * (3 * D * D)
    rows = tl.where(is_value, 2 * D, 0) + head * HD + j  # (HD_PAD,): W_q rows, or W_v rows for the value program
    ok = (has_role & (j < HD))[:, None] & (line < D)[None, :]
    _prefetch_lines(w_base + rows[:, None] * D + line[None, :], ok, w_base)
    key_ok = ((j * 0 + pid) >= H * CHUNKS) & ((j * 0 + pid) < H * CHUNKS + H) & (j < HD)
    _prefetch_lines(w_base + (D + head * HD + j)[:, None] * D + line[None, :], key_ok[:, None] & (line < D)[None, :],
                    w_base)
    write_pos = tl.minimum(tl.load(cache_len_ptr), MAX_LEN - 1)
    span = tl.cdiv(write_pos, CHUNKS)
    lo = rank * span
    position = lo + tl.arange(0, BLOCK_L)
    position_ok = (position < tl.minimum(lo + span, write_pos)) & ((position * 0 + pid) < H * CHUNKS)
    cache = cache_ptr + layer * cache_layer_stride + head * HD
    _prefetch_lines(cache + position * (2 * D), position_ok, cache)  # the keys' 64 bytes a position
    _prefetch_lines(cache + D + position * (2 * D), position_ok, cache)  # and the values'


@triton.jit
def _prefetch_ffn_tile(pid, layer, ffn1_w_ptr, ffn2_w_ptr, D: tl.constexpr, D_PAD: tl.constexpr, FFN: tl.constexpr,
                       BN: tl.constexpr):
    """L2 lines of the program's W_1 rows and W_2 columns in ``_ffn_phase`` of ``layer``."""
    unit = pid * BN + tl.arange(0, BN)
    line = tl.arange(0, (D_PAD + 63) // 64) * 64
    w1 = ffn1_w_ptr + layer * (FFN * D)
    _prefetch_lines(w1 + unit[:, None] * D + line[None, :], (unit < FFN)[:, None] & (line < D)[None, :], w1)
    dim = tl.arange(0, D_PAD)
    w2 = ffn2_w_ptr + layer * (D * FFN)
    first_unit = dim * 0 + pid * BN  # (D_PAD,): the program's W_2 columns start a 32-byte run in each row
    _prefetch_lines(w2 + dim * FFN + first_unit, (dim < D) & (first_unit < FFN), w2)


@triton.jit
def _stamp(timeline_ptr, event, TIMELINE: tl.constexpr):
    """TIMELINE: the GPU's global nanosecond clock, now, into ``timeline_ptr`` (events, programs) at
    (event, this program); otherwise nothing. A store, so it joins what the next release waits for."""
    if TIMELINE:
        pid = tl.program_id(0)
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False,
                                        pack=1)
        tl.store(timeline_ptr + event * tl.num_programs(0) + pid, now)


@triton.jit
def _replica_sum(row_ptr, dim, ok, D: tl.constexpr, REPLICAS: tl.constexpr):
    """A sum row (D_PAD,) kept as ``REPLICAS`` rows of D floats that programs added into during
    this step (read through L2): their sum. The loads are independent, so they overlap."""
    total = tl.load(row_ptr + dim, mask=ok, other=0.0, cache_modifier=".cg")
    for replica in tl.static_range(1, REPLICAS):
        total += tl.load(row_ptr + replica * D + dim, mask=ok, other=0.0, cache_modifier=".cg")
    return total


@triton.jit
def _norm_params(weight_ptr, bias_ptr, dim, ok, HOIST: tl.constexpr):
    """HOIST: a LayerNorm's scale and shift (D_PAD,) float32, loaded where this is called (before a
    phase's grid barrier, so their latency hides behind the wait); otherwise zeros that
    ``_phase_layer_norm`` does not read."""
    if HOIST:
        gamma = tl.load(weight_ptr + dim, mask=ok, other=0.0).to(tl.float32)
        beta = tl.load(bias_ptr + dim, mask=ok, other=0.0).to(tl.float32)
    else:
        gamma = dim * 0.0
        beta = dim * 0.0
    return gamma, beta


@triton.jit
def _add_pairs(a, b, c, d):
    """tl.reduce's combine for two sums carried together."""
    return a + c, b + d


@triton.jit
def _phase_layer_norm(values, ok, gamma, beta, weight_ptr, bias_ptr, dim, D: tl.constexpr, EPS: tl.constexpr,
                      HOIST: tl.constexpr, ONE_PASS: tl.constexpr):
    """LayerNorm of a (D_PAD,) row after a grid barrier. HOIST: with ``gamma`` and ``beta`` from
    ``_norm_params``. Otherwise the loads of the scale and shift follow the row's two reductions, as
    they were first written: each reduction ends in a block barrier, which no load crosses, so those
    loads then add a memory round trip to the phase's critical path (kept to measure that). ONE_PASS:
    the mean and the variance from one reduction of (x, x^2), E[x^2] - mean^2, instead of a reduction
    for the mean and another for the centred squares: each reduction across the program's warps costs
    shared-memory exchanges behind block barriers (3 of them fewer a LayerNorm in the compiled kernel),
    for a variance whose float32 rounding differs."""
    if ONE_PASS:  # with HOIST (the engine checks): the sum and the sum of squares in one reduction
        total, squares = tl.reduce((values, values * values), 0, _add_pairs)
        mean = total / D
        rstd = 1.0 / tl.sqrt(tl.maximum(squares / D - mean * mean, 0.0) + EPS)
        normed = tl.where(ok, (values - mean) * rstd * gamma + beta, 0.0)
    elif HOIST:
        normed = layer_norm_with(values, ok, gamma, beta, D, EPS)
    else:
        mean = tl.sum(values, axis=0) / D
        centred = tl.where(ok, values - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / D + EPS)
        late_gamma = tl.load(weight_ptr + dim, mask=ok, other=0.0).to(tl.float32)
        late_beta = tl.load(bias_ptr + dim, mask=ok, other=0.0).to(tl.float32)
        normed = tl.where(ok, centred * rstd * late_gamma + late_beta, 0.0)
    return normed


@triton.jit
def _layer_input(layer, token, position, embedding_ptr, positions_ptr, sum_ptr, norm_w_ptr, norm_b_ptr, gamma, beta,
                 D: tl.constexpr, D_PAD: tl.constexpr, EPS: tl.constexpr, REPLICAS: tl.constexpr,
                 HOIST: tl.constexpr, ONE_PASS: tl.constexpr):
    """The layer's input row (D_PAD,): the token's embedding at layer 0, else LayerNorm 2 of the
    previous layer's sum (``REPLICAS`` rows); ``gamma``, ``beta``: that norm's, with HOIST."""
    dim = tl.arange(0, D_PAD)
    ok = dim < D
    if layer == 0:
        x = tl.load(embedding_ptr + token * D + dim, mask=ok, other=0.0).to(tl.float32)
        x += tl.load(positions_ptr + position * D + dim, mask=ok, other=0.0).to(tl.float32)
    else:
        summed = _replica_sum(sum_ptr, dim, ok, D, REPLICAS)
        x = _phase_layer_norm(summed, ok, gamma, beta, norm_w_ptr + (layer - 1) * D, norm_b_ptr + (layer - 1) * D,
                              dim, D, EPS, HOIST, ONE_PASS)
    return x


@triton.jit
def _attend_phase(
    pid, layer, counter_ptr, error_ptr, target, last_token_ptr, audio_pos_ptr, cache_len_ptr,
    embedding_ptr, positions_ptr, sum2_ptr, norm2_w_ptr, norm2_b_ptr, qkv_w_ptr, qkv_b_ptr,
    cache_ptr, cache_layer_stride, xin_ptr, part_m_ptr, part_s_ptr, part_acc_ptr, scale,
    arrivals_ptr, out_w_ptr, out_b_ptr, sum1_ptr, q_ptr,
    D: tl.constexpr, D_PAD: tl.constexpr, H: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr,
    CHUNKS: tl.constexpr, CHUNK_MAX: tl.constexpr, BLOCK_L: tl.constexpr, MAX_LEN: tl.constexpr,
    MAX_POSITION: tl.constexpr, SUM2_STRIDE: tl.constexpr, EPS: tl.constexpr, SYNC: tl.constexpr,
    ASM: tl.constexpr, FOLD_OUT: tl.constexpr, PARTS_PAD: tl.constexpr, PREFETCH_OUT: tl.constexpr,
    SUM1_REPLICAS: tl.constexpr, SUM2_REPLICAS: tl.constexpr, LATE_KEY_SCORE: tl.constexpr,
    SPLIT_OUT: tl.constexpr, OUT_ROWS: tl.constexpr, OUT_GROUPS: tl.constexpr,
    timeline_ptr, layer_stamps_ptr, TIMELINE: tl.constexpr, STREAM_EVICT: tl.constexpr, OUT_EVICT: tl.constexpr,
    HOIST: tl.constexpr, ONE_PASS: tl.constexpr,
):
    """With FOLD_OUT, the head's last program to arrive also does the out phase's work for that head
    (module docstring): ``arrivals_ptr`` (layers, H) counters and ``sum1_ptr`` (layers, SUM1_REPLICAS
    x D) rows, both zeroed before the step. PREFETCH_OUT: every program of a head loads the head's
    W_o columns as soon as its own projection is done, since any of them may be the one to use them. LATE_KEY_SCORE
    (with FOLD_OUT): the key program loads W_k rows only and writes k; chunk 0 of the head writes its
    q to ``q_ptr`` (H, HD), and the head's last program scores the new key itself. SPLIT_OUT (with
    FOLD_OUT): every program of a head, once the head's last partial is in, adds its OUT_ROWS rows of
    the head's out projection (W_o rows loaded before the barrier); without SYNC (one phase a launch)
    that is left to PHASE_HEAD_OUT's launch."""
    _grid_arrive(counter_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)  # arrive-first: before the tile loads
    dim = tl.arange(0, D_PAD)
    dim_ok = dim < D
    j = tl.arange(0, HD_PAD)
    j_ok = j < HD
    # Roles: (head, chunk) programs attend a chunk of the cached positions; per head, a key program
    # makes the new token's k (and its score) and a value program its v: so no program holds more
    # than two weight tiles in registers.
    is_chunk, is_key, is_value, head, rank = _program_role(pid, H, CHUNKS)
    chunk = tl.where(is_chunk, rank, CHUNKS)  # the new position's partial sits after the chunks
    # Prefetch before the barrier: W_q rows of the head (W_v rows for the value program), and W_k
    # rows for the key program. Row masks are vectors: a scalar condition and'ed into a block
    # mask trips Triton's interpreter.
    w_base = qkv_w_ptr + layer * (3 * D * D)
    b_base = qkv_b_ptr + layer * (3 * D)
    pid_rows = j * 0 + pid  # (HD_PAD,)
    if LATE_KEY_SCORE:  # one tile a program: W_q (chunks), W_k (key program) or W_v (value program)
        rows_a = tl.where(is_value, 2 * D, tl.where(is_key, D, 0)) + head * HD + j  # (HD_PAD,)
    else:
        rows_a = tl.where(is_value, 2 * D, 0) + head * HD + j  # (HD_PAD,)
    a_ok = j_ok & (pid_rows < H * CHUNKS + 2 * H)
    w_a = tl.load(w_base + rows_a[:, None] * D + dim[None, :], mask=a_ok[:, None] & dim_ok[None, :], other=0.0,
                  eviction_policy=STREAM_EVICT)
    bias_a = tl.load(b_base + rows_a, mask=j_ok, other=0.0).to(tl.float32)
    if not LATE_KEY_SCORE:
        b_ok = j_ok & (pid_rows >= H * CHUNKS) & (pid_rows < H * CHUNKS + H)
        w_b = tl.load(w_base + (D + head * HD + j)[:, None] * D + dim[None, :], mask=b_ok[:, None] & dim_ok[None, :],
                      other=0.0, eviction_policy=STREAM_EVICT)  # (HD_PAD, D_PAD)
        bias_b = tl.load(b_base + D + head * HD + j, mask=j_ok, other=0.0).to(tl.float32)
    token = tl.load(last_token_ptr)
    position = tl.minimum(tl.load(audio_pos_ptr), MAX_POSITION - 1)
    write_pos = tl.minimum(tl.load(cache_len_ptr), MAX_LEN - 1)
    # Past positions 0..write_pos-1, split evenly over the head's chunks. They were written by
    # earlier steps, so the chunk's first block of keys and values is read before the barrier too.
    cache = cache_ptr + layer * cache_layer_stride + head * HD
    span = tl.cdiv(write_pos, CHUNKS)
    lo = chunk * span
    hi = tl.minimum(lo + span, write_pos)
    first_pos = lo + tl.arange(0, BLOCK_L)
    first_ok = (first_pos < hi) & ((first_pos * 0 + pid) < H * CHUNKS)  # (BLOCK_L,)
    first_kv_ok = first_ok[:, None] & j_ok[None, :]
    first_keys = tl.load(cache + first_pos[:, None] * (2 * D) + j[None, :], mask=first_kv_ok, other=0.0)
    first_values = tl.load(cache + D + first_pos[:, None] * (2 * D) + j[None, :], mask=first_kv_ok, other=0.0)
    if SPLIT_OUT:
        out_rows_w, out_rows, out_rows_ok = _head_out_rows(out_w_ptr, layer, pid, head, rank, D, HD, HD_PAD, H, CHUNKS,
                                                           OUT_ROWS, OUT_GROUPS)
    norm_row = tl.maximum(layer - 1, 0) * D  # LayerNorm 2 of the previous layer (unused at layer 0)
    gamma, beta = _norm_params(norm2_w_ptr + norm_row, norm2_b_ptr + norm_row, dim, dim_ok, HOIST)

    _grid_barrier(counter_ptr, error_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)

    previous_sum2 = sum2_ptr + tl.maximum(layer - 1, 0) * SUM2_STRIDE
    x = _layer_input(layer, token, position, embedding_ptr, positions_ptr, previous_sum2, norm2_w_ptr, norm2_b_ptr,
                     gamma, beta, D, D_PAD, EPS, SUM2_REPLICAS, HOIST, ONE_PASS)  # (D_PAD,)
    if pid == 0:
        tl.store(xin_ptr + dim, x, mask=dim_ok)
    # (HD_PAD,): q; v for the value program; k for the key program under LATE_KEY_SCORE
    a = tl.sum(w_a.to(tl.float32) * x[None, :], axis=1) + bias_a
    if PREFETCH_OUT:  # the engine allows it only with FOLD_OUT
        # Issued here, when w_a is dead: its latency overlaps the program's attention work.
        has_role = (dim * 0 + pid) < H * CHUNKS + 2 * H  # (D_PAD,)
        out_columns = _head_out_columns(out_w_ptr, layer, head, has_role & dim_ok, D, D_PAD, HD, HD_PAD, OUT_EVICT)
    else:
        out_columns = 0  # loaded by the head's last program after its arrival
    q = a * scale
    part = head * (CHUNKS + 1) + chunk
    new_slot = cache + write_pos * (2 * D)
    # k and v are rounded to the cache's dtype first, as later steps will read them.
    if is_key:
        if LATE_KEY_SCORE:
            tl.store(new_slot + j, a.to(cache_ptr.dtype.element_ty), mask=j_ok)
        else:
            k = (tl.sum(w_b.to(tl.float32) * x[None, :], axis=1) + bias_b).to(cache_ptr.dtype.element_ty)
            tl.store(new_slot + j, k, mask=j_ok)
            tl.store(part_m_ptr + part, tl.sum(tl.where(j_ok, q * k.to(tl.float32), 0.0), axis=0))
            tl.store(part_s_ptr + part, 1.0)
    if is_value:
        v = a.to(cache_ptr.dtype.element_ty)
        tl.store(new_slot + D + j, v, mask=j_ok)
        tl.store(part_acc_ptr + part * HD + j, v.to(tl.float32), mask=j_ok)
    if is_chunk:
        if LATE_KEY_SCORE:
            if chunk == 0:
                tl.store(q_ptr + head * HD + j, q, mask=j_ok)
        scores = tl.where(first_ok, tl.sum(first_keys.to(tl.float32) * q[None, :], axis=1), float("-inf"))
        best = tl.max(scores, axis=0)  # -inf for an empty chunk, whose partial then weighs nothing
        weights = tl.where(first_ok, tl.exp(scores - best), 0.0)
        acc = tl.sum(weights[:, None] * first_values.to(tl.float32), axis=0)  # (HD_PAD,)
        total = tl.sum(weights, axis=0)
        # Chunks longer than one block (long caches): the rest after the barrier, online softmax.
        for start in range(BLOCK_L, CHUNK_MAX, BLOCK_L):
            if lo + start < hi:
                pos = lo + start + tl.arange(0, BLOCK_L)
                pos_ok = pos < hi
                kv_ok = pos_ok[:, None] & j_ok[None, :]
                keys = tl.load(cache + pos[:, None] * (2 * D) + j[None, :], mask=kv_ok, other=0.0)  # (BLOCK_L, HD_PAD)
                scores = tl.where(pos_ok, tl.sum(keys.to(tl.float32) * q[None, :], axis=1), float("-inf"))
                new_best = tl.maximum(best, tl.max(scores, axis=0))
                weights = tl.exp(scores - new_best)
                rescale = tl.exp(best - new_best)
                values = tl.load(cache + D + pos[:, None] * (2 * D) + j[None, :], mask=kv_ok, other=0.0)
                acc = acc * rescale + tl.sum(weights[:, None] * values.to(tl.float32), axis=0)
                total = total * rescale + tl.sum(weights, axis=0)
                best = new_best
        tl.store(part_m_ptr + part, best)
        tl.store(part_s_ptr + part, total)
        tl.store(part_acc_ptr + part * HD + j, acc, mask=j_ok)
    _stamp(layer_stamps_ptr, 2 * layer, TIMELINE)  # the program's partial written
    if SPLIT_OUT:
        if SYNC:
            if is_chunk | is_key | is_value:
                # The head's counter as a barrier of its CHUNKS + 2 programs: the arrival releases this
                # program's partial, the wait acquires the others'. The target is a tensor, as the
                # barrier's inline PTX takes one.
                _grid_barrier(arrivals_ptr + layer * H + head, error_ptr, head * 0 + CHUNKS + 2, SYNC, ASM & 3,
                              timeline_ptr, False)
                _add_head_out_rows(head, rank, layer, x, out_rows_w, out_rows, out_rows_ok, out_b_ptr, part_m_ptr,
                                   part_s_ptr, part_acc_ptr, sum1_ptr, D, D_PAD, HD, HD_PAD, CHUNKS, PARTS_PAD,
                                   SUM1_REPLICAS, OUT_ROWS, OUT_GROUPS, HOIST)
    elif FOLD_OUT:
        if is_chunk | is_key | is_value:
            _fold_out_of_head(head, layer, x, arrivals_ptr, out_w_ptr, out_b_ptr, part_m_ptr, part_s_ptr,
                              part_acc_ptr, sum1_ptr, out_columns, q_ptr, new_slot, D, D_PAD, H, HD, HD_PAD, CHUNKS,
                              PARTS_PAD, PREFETCH_OUT, SUM1_REPLICAS, LATE_KEY_SCORE, OUT_EVICT, HOIST)
    _stamp(layer_stamps_ptr, 2 * layer + 1, TIMELINE)  # and the head's out projection, where it was the last


@triton.jit
def _head_partial_scores(head, part_m_ptr, part_s_ptr, PARTS: tl.constexpr, CHUNKS: tl.constexpr,
                         PARTS_PAD: tl.constexpr):
    """(maxima, weight sums) (PARTS_PAD,) of the head's first PARTS softmax partials, read through L2;
    the rest read as an empty partial (-inf, 0)."""
    c = tl.arange(0, PARTS_PAD)
    ok = c < PARTS
    part = head * (CHUNKS + 1) + c
    best = tl.load(part_m_ptr + part, mask=ok, other=float("-inf"), cache_modifier=".cg")
    total = tl.load(part_s_ptr + part, mask=ok, other=0.0, cache_modifier=".cg")
    return best, total


@triton.jit
def _merge_head_partials(head, best, total, part_acc_ptr, CHUNKS: tl.constexpr, PARTS_PAD: tl.constexpr,
                         HD: tl.constexpr, HD_PAD: tl.constexpr, HOIST: tl.constexpr):
    """The head's attention output (HD_PAD,) from its CHUNKS + 1 softmax partials: ``best`` and
    ``total`` (PARTS_PAD,) their maxima and weight sums, their weighted values read through L2.
    HOIST: those values are loaded before the maximum is reduced, whose block barrier a later load
    would wait behind."""
    c = tl.arange(0, PARTS_PAD)
    c_ok = c < CHUNKS + 1
    part = head * (CHUNKS + 1) + c
    j = tl.arange(0, HD_PAD)
    acc_pointers = part_acc_ptr + part[:, None] * HD + j[None, :]
    acc_ok = c_ok[:, None] & (j < HD)[None, :]
    if HOIST:
        acc = tl.load(acc_pointers, mask=acc_ok, other=0.0, cache_modifier=".cg")  # (PARTS_PAD, HD_PAD)
    factor = tl.where(c_ok, tl.exp(best - tl.max(best, axis=0)), 0.0)  # (PARTS_PAD,)
    if not HOIST:
        acc = tl.load(acc_pointers, mask=acc_ok, other=0.0, cache_modifier=".cg")
    return tl.sum(acc * factor[:, None], axis=0) / tl.sum(total * factor, axis=0)


@triton.jit
def _program_role(pid, H: tl.constexpr, CHUNKS: tl.constexpr):
    """(is_chunk, is_key, is_value, head, rank) of a program in the attend phase: (head, chunk)
    programs first, then a key and a value program per head; ``rank`` numbers a head's programs
    (its chunks 0..CHUNKS-1, the key CHUNKS, the value CHUNKS + 1)."""
    is_chunk = pid < H * CHUNKS
    is_key = (pid >= H * CHUNKS) & (pid < H * CHUNKS + H)
    is_value = (pid >= H * CHUNKS + H) & (pid < H * CHUNKS + 2 * H)
    head = tl.where(is_chunk, pid // CHUNKS, tl.where(is_key, pid - H * CHUNKS, pid - H * CHUNKS - H))
    rank = tl.where(is_chunk, pid % CHUNKS, tl.where(is_key, CHUNKS, CHUNKS + 1))
    return is_chunk, is_key, is_value, head, rank


@triton.jit
def _head_out_rows(out_w_ptr, layer, pid, head, rank, D: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr,
                   H: tl.constexpr, CHUNKS: tl.constexpr, OUT_ROWS: tl.constexpr, OUT_GROUPS: tl.constexpr):
    """(W_o[rows, head's HD columns] (OUT_ROWS, HD_PAD), rows (OUT_ROWS,), rows_ok): the rows of the
    head's share of the out projection that its program of ``rank`` computes under SPLIT_OUT (ranks
    from OUT_GROUPS on, and programs without a role, take none)."""
    rows = rank * OUT_ROWS + tl.arange(0, OUT_ROWS)
    owner = ((rows * 0 + pid) < H * CHUNKS + 2 * H) & ((rows * 0 + rank) < OUT_GROUPS)  # vectors, for the interpreter
    rows_ok = (rows < D) & owner
    j = tl.arange(0, HD_PAD)
    w = tl.load(out_w_ptr + layer * (D * D) + rows[:, None] * D + (head * HD + j)[None, :],
                mask=rows_ok[:, None] & (j < HD)[None, :], other=0.0)
    return w, rows, rows_ok


@triton.jit
def _add_head_out_rows(head, rank, layer, x, w, rows, rows_ok, out_b_ptr, part_m_ptr, part_s_ptr, part_acc_ptr,
                       sum1_ptr, D: tl.constexpr, D_PAD: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr,
                       CHUNKS: tl.constexpr, PARTS_PAD: tl.constexpr, SUM1_REPLICAS: tl.constexpr,
                       OUT_ROWS: tl.constexpr, OUT_GROUPS: tl.constexpr, HOIST: tl.constexpr):
    """SPLIT_OUT, once every partial of the head is written: the program's rows of W_o[:, head] times
    the head's attention, added into the layer's sum 1 row (the lead head adds those rows' bias and
    layer input ``x`` (D_PAD,) too). HOIST: the bias is loaded with the partials, not after the product."""
    lead = (rows * 0 + head) == 0
    bias_pointers = out_b_ptr + layer * D + rows
    if HOIST:
        bias = tl.load(bias_pointers, mask=rows_ok & lead, other=0.0).to(tl.float32)
    best, total = _head_partial_scores(head, part_m_ptr, part_s_ptr, CHUNKS + 1, CHUNKS, PARTS_PAD)
    attention = _merge_head_partials(head, best, total, part_acc_ptr, CHUNKS, PARTS_PAD, HD, HD_PAD, HOIST)
    out = tl.sum(w.to(tl.float32) * attention[None, :], axis=1)  # (OUT_ROWS,)
    # x's entries at the rows: D_PAD = OUT_GROUPS x OUT_ROWS, one group a rank.
    groups = tl.reshape(x, (OUT_GROUPS, OUT_ROWS))
    x_rows = tl.sum(tl.where((tl.arange(0, OUT_GROUPS) == rank)[:, None], groups, 0.0), axis=0)  # (OUT_ROWS,)
    if not HOIST:
        bias = tl.load(bias_pointers, mask=rows_ok & lead, other=0.0).to(tl.float32)
    out += tl.where(lead, bias + x_rows, 0.0)
    row = sum1_ptr + (layer * SUM1_REPLICAS + head % SUM1_REPLICAS) * D
    tl.atomic_add(row + rows, out, mask=rows_ok, sem="relaxed", scope="gpu")


@triton.jit
def _head_out_columns(out_w_ptr, layer, head, rows_ok, D: tl.constexpr, D_PAD: tl.constexpr, HD: tl.constexpr,
                      HD_PAD: tl.constexpr, EVICT: tl.constexpr):
    """W_o[:, head's HD columns] of the layer, (D_PAD, HD_PAD); rows where ``rows_ok`` is False read 0.
    EVICT: the load's L2 eviction policy ("" the default)."""
    dim = tl.arange(0, D_PAD)
    j = tl.arange(0, HD_PAD)
    return tl.load(out_w_ptr + layer * (D * D) + dim[:, None] * D + (head * HD + j)[None, :],
                   mask=rows_ok[:, None] & (j < HD)[None, :], other=0.0, eviction_policy=EVICT)


@triton.jit
def _fold_out_of_head(
    head, layer, x, arrivals_ptr, out_w_ptr, out_b_ptr, part_m_ptr, part_s_ptr, part_acc_ptr, sum1_ptr, out_columns,
    q_ptr, new_slot,
    D: tl.constexpr, D_PAD: tl.constexpr, H: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr,
    CHUNKS: tl.constexpr, PARTS_PAD: tl.constexpr, PREFETCH_OUT: tl.constexpr, SUM1_REPLICAS: tl.constexpr,
    LATE_KEY_SCORE: tl.constexpr, OUT_EVICT: tl.constexpr, HOIST: tl.constexpr,
):
    """Count this program's arrival at its head; the head's last arrival (of CHUNKS chunk programs,
    the key and the value program) adds W_o[:, head] . attention(head) into its replica of the
    layer's sum 1 row. ``out_columns``: that W_o tile when PREFETCH_OUT loaded it already. With
    LATE_KEY_SCORE the new position's partial (score q . k_new, weight 1) is made here from the q of
    the head's chunk 0 and the k the key program wrote at ``new_slot``. HOIST: the last arrival
    issues its bias load first, so it travels with the partials' loads instead of waiting behind the
    merge's block barriers."""
    tl.debug_barrier()  # every thread's partial stores before the arrival (released by the add)
    arrived = tl.atomic_add(arrivals_ptr + layer * H + head, 1, sem="acq_rel", scope="gpu")
    if arrived == CHUNKS + 1:
        tl.debug_barrier()  # the acquire before any thread reads the other programs' partials
        j = tl.arange(0, HD_PAD)
        j_ok = j < HD
        dim = tl.arange(0, D_PAD)
        dim_ok = dim < D
        lead = (dim * 0 + head) == 0  # (D_PAD,): the lead head adds the bias and the layer input once
        bias_pointers = out_b_ptr + layer * D + dim
        if HOIST:
            bias = tl.load(bias_pointers, mask=dim_ok & lead, other=0.0).to(tl.float32)
        if LATE_KEY_SCORE:
            # The new position's slot (c == CHUNKS) is filled here.
            best, total = _head_partial_scores(head, part_m_ptr, part_s_ptr, CHUNKS, CHUNKS, PARTS_PAD)
            c = tl.arange(0, PARTS_PAD)
            q = tl.load(q_ptr + head * HD + j, mask=j_ok, other=0.0, cache_modifier=".cg")
            k = tl.load(new_slot + j, mask=j_ok, other=0.0, cache_modifier=".cg").to(tl.float32)
            new_score = tl.sum(tl.where(j_ok, q * k, 0.0), axis=0)
            best = tl.where(c == CHUNKS, new_score, best)
            total = tl.where(c == CHUNKS, 1.0, total)
        else:
            best, total = _head_partial_scores(head, part_m_ptr, part_s_ptr, CHUNKS + 1, CHUNKS, PARTS_PAD)
        attention = _merge_head_partials(head, best, total, part_acc_ptr, CHUNKS, PARTS_PAD, HD, HD_PAD, HOIST)
        # The W_o tile is loaded after the merge, even with HOIST: issued beside the partials' loads it
        # made the out projection 1.4 us slower a layer on an H100 (docs/results/h100_37_t2s_hoist.json),
        # most likely as its 32 KB of loads queue ahead of the merge's shared-memory reductions.
        if PREFETCH_OUT:
            w = out_columns
        else:
            w = _head_out_columns(out_w_ptr, layer, head, dim_ok, D, D_PAD, HD, HD_PAD, OUT_EVICT)  # (D_PAD, HD_PAD)
        out = tl.sum(w.to(tl.float32) * attention[None, :], axis=1)  # (D_PAD,)
        if not HOIST:
            bias = tl.load(bias_pointers, mask=dim_ok & lead, other=0.0).to(tl.float32)
        out += tl.where(lead, bias + x, 0.0)
        # Heads spread over the replicas: fewer float atomics queue on each address.
        row = sum1_ptr + (layer * SUM1_REPLICAS + head % SUM1_REPLICAS) * D
        tl.atomic_add(row + dim, out, mask=dim_ok, sem="relaxed", scope="gpu")


@triton.jit
def _out_phase(
    pid, layer, counter_ptr, error_ptr, target, out_w_ptr, out_b_ptr, xin_ptr, part_m_ptr, part_s_ptr,
    part_acc_ptr, sum1_ptr,
    D: tl.constexpr, H: tl.constexpr, H_PAD: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr,
    CHUNKS: tl.constexpr, PARTS_PAD: tl.constexpr, BN: tl.constexpr, SYNC: tl.constexpr, ASM: tl.constexpr,
    timeline_ptr, TIMELINE: tl.constexpr,
):
    _grid_arrive(counter_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)  # arrive-first: before the tile loads
    col = pid * BN + tl.arange(0, BN)
    col_ok = col < D
    h = tl.arange(0, H_PAD)
    h_ok = h < H
    j = tl.arange(0, HD_PAD)
    j_ok = j < HD
    # (BN, H_PAD, HD_PAD): W_o[col, h * HD + j], read before the barrier.
    w_ok = col_ok[:, None, None] & h_ok[None, :, None] & j_ok[None, None, :]
    w = tl.load(out_w_ptr + layer * (D * D) + col[:, None, None] * D + (h[None, :, None] * HD + j[None, None, :]),
                mask=w_ok, other=0.0)
    bias = tl.load(out_b_ptr + layer * D + col, mask=col_ok, other=0.0).to(tl.float32)

    _grid_barrier(counter_ptr, error_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)

    c = tl.arange(0, PARTS_PAD)
    part_ok = h_ok[:, None] & (c < CHUNKS + 1)[None, :]
    part = h[:, None] * (CHUNKS + 1) + c[None, :]  # (H_PAD, PARTS_PAD)
    best = tl.load(part_m_ptr + part, mask=part_ok, other=float("-inf"), cache_modifier=".cg")
    total = tl.load(part_s_ptr + part, mask=part_ok, other=0.0, cache_modifier=".cg")
    head_best = tl.max(best, axis=1)  # (H_PAD,): finite for real heads (the new position is always there)
    head_best = tl.where(h_ok, head_best, 0.0)
    factor = tl.where(part_ok, tl.exp(best - head_best[:, None]), 0.0)  # (H_PAD, PARTS_PAD)
    denominator = tl.sum(total * factor, axis=1)  # (H_PAD,)
    acc_ok = part_ok[:, :, None] & j_ok[None, None, :]
    acc = tl.load(part_acc_ptr + part[:, :, None] * HD + j[None, None, :], mask=acc_ok, other=0.0,
                  cache_modifier=".cg")  # (H_PAD, PARTS_PAD, HD_PAD)
    attention = tl.sum(acc * factor[:, :, None], axis=1) / tl.where(h_ok, denominator, 1.0)[:, None]  # (H_PAD, HD_PAD)
    out = tl.sum(tl.sum(w.to(tl.float32) * attention[None, :, :], axis=2), axis=1) + bias  # (BN,)
    out += tl.load(xin_ptr + col, mask=col_ok, other=0.0, cache_modifier=".cg")
    tl.store(sum1_ptr + col, out, mask=col_ok)


@triton.jit
def _ffn1_phase(
    pid, layer, counter_ptr, error_ptr, target, ffn1_w_ptr, ffn1_b_ptr, norm1_w_ptr, norm1_b_ptr, sum1_ptr,
    normed1_ptr, hidden_ptr,
    D: tl.constexpr, D_PAD: tl.constexpr, FFN: tl.constexpr, BN: tl.constexpr, EPS: tl.constexpr,
    SYNC: tl.constexpr, ASM: tl.constexpr, SUM1_REPLICAS: tl.constexpr,
    timeline_ptr, TIMELINE: tl.constexpr, HOIST: tl.constexpr, ONE_PASS: tl.constexpr,
):
    _grid_arrive(counter_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)  # arrive-first: before the tile loads
    col = pid * BN + tl.arange(0, BN)
    col_ok = col < FFN
    dim = tl.arange(0, D_PAD)
    dim_ok = dim < D
    w = tl.load(ffn1_w_ptr + layer * (FFN * D) + col[:, None] * D + dim[None, :],
                mask=col_ok[:, None] & dim_ok[None, :], other=0.0)  # (BN, D_PAD)
    bias = tl.load(ffn1_b_ptr + layer * FFN + col, mask=col_ok, other=0.0).to(tl.float32)
    gamma, beta = _norm_params(norm1_w_ptr + layer * D, norm1_b_ptr + layer * D, dim, dim_ok, HOIST)

    _grid_barrier(counter_ptr, error_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)

    summed = _replica_sum(sum1_ptr, dim, dim_ok, D, SUM1_REPLICAS)
    x = _phase_layer_norm(summed, dim_ok, gamma, beta, norm1_w_ptr + layer * D, norm1_b_ptr + layer * D, dim, D, EPS,
                          HOIST, ONE_PASS)
    if pid == 0:
        tl.store(normed1_ptr + dim, x, mask=dim_ok)
    hidden = tl.maximum(tl.sum(w.to(tl.float32) * x[None, :], axis=1) + bias, 0.0)
    tl.store(hidden_ptr + col, hidden, mask=col_ok)


@triton.jit
def _ffn2_phase(
    pid, layer, counter_ptr, error_ptr, target, ffn2_w_ptr, ffn2_b_ptr, hidden_ptr, normed1_ptr, sum2_ptr,
    D: tl.constexpr, FFN: tl.constexpr, FFN_PAD: tl.constexpr, BN: tl.constexpr, SYNC: tl.constexpr,
    ASM: tl.constexpr,
    timeline_ptr, TIMELINE: tl.constexpr,
):
    _grid_arrive(counter_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)  # arrive-first: before the tile loads
    col = pid * BN + tl.arange(0, BN)
    col_ok = col < D
    k = tl.arange(0, FFN_PAD)
    k_ok = k < FFN
    w = tl.load(ffn2_w_ptr + layer * (D * FFN) + col[:, None] * FFN + k[None, :],
                mask=col_ok[:, None] & k_ok[None, :], other=0.0)  # (BN, FFN_PAD)
    bias = tl.load(ffn2_b_ptr + layer * D + col, mask=col_ok, other=0.0).to(tl.float32)

    _grid_barrier(counter_ptr, error_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)

    hidden = tl.load(hidden_ptr + k, mask=k_ok, other=0.0, cache_modifier=".cg")
    out = tl.sum(w.to(tl.float32) * hidden[None, :], axis=1) + bias
    out += tl.load(normed1_ptr + col, mask=col_ok, other=0.0, cache_modifier=".cg")
    tl.store(sum2_ptr + col, out, mask=col_ok)


@triton.jit
def _ffn_phase(
    pid, layer, counter_ptr, error_ptr, target, ffn1_w_ptr, ffn1_b_ptr, ffn2_w_ptr, ffn2_b_ptr, norm1_w_ptr,
    norm1_b_ptr, sum1_ptr, sum2_ptr,
    D: tl.constexpr, D_PAD: tl.constexpr, FFN: tl.constexpr, BN: tl.constexpr, EPS: tl.constexpr,
    SYNC: tl.constexpr, ASM: tl.constexpr, SUM1_REPLICAS: tl.constexpr, SUM2_REPLICAS: tl.constexpr,
    timeline_ptr, TIMELINE: tl.constexpr, STREAM_EVICT: tl.constexpr, HOIST: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    """Both FFN products for the program's ``BN`` hidden units; the partial of sum 2 is atomically
    added into the program's replica (pid mod SUM2_REPLICAS) of the layer's sum 2 row (zeroed
    before the step)."""
    _grid_arrive(counter_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)  # arrive-first: before the tile loads
    unit = pid * BN + tl.arange(0, BN)
    unit_ok = unit < FFN
    dim = tl.arange(0, D_PAD)
    dim_ok = dim < D
    w_ok = unit_ok[:, None] & dim_ok[None, :]
    w1 = tl.load(ffn1_w_ptr + layer * (FFN * D) + unit[:, None] * D + dim[None, :], mask=w_ok, other=0.0,
                 eviction_policy=STREAM_EVICT)  # (BN, D_PAD)
    b1 = tl.load(ffn1_b_ptr + layer * FFN + unit, mask=unit_ok, other=0.0).to(tl.float32)
    # W_2 is (D, FFN): the program's columns, as (BN, D_PAD).
    w2 = tl.load(ffn2_w_ptr + layer * (D * FFN) + dim[None, :] * FFN + unit[:, None], mask=w_ok, other=0.0,
                 eviction_policy=STREAM_EVICT)
    # Program 0 adds the bias and the residual once.
    lead = (dim * 0 + pid) == 0  # (D_PAD,): a vector, as the interpreter needs in a mask
    b2 = tl.load(ffn2_b_ptr + layer * D + dim, mask=dim_ok & lead, other=0.0).to(tl.float32)
    gamma, beta = _norm_params(norm1_w_ptr + layer * D, norm1_b_ptr + layer * D, dim, dim_ok, HOIST)

    _grid_barrier(counter_ptr, error_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)

    summed = _replica_sum(sum1_ptr, dim, dim_ok, D, SUM1_REPLICAS)
    x = _phase_layer_norm(summed, dim_ok, gamma, beta, norm1_w_ptr + layer * D, norm1_b_ptr + layer * D, dim, D, EPS,
                          HOIST, ONE_PASS)  # (D_PAD,)
    hidden = tl.maximum(tl.sum(w1.to(tl.float32) * x[None, :], axis=1) + b1, 0.0)  # (BN,)
    partial = tl.sum(w2.to(tl.float32) * hidden[:, None], axis=0)  # (D_PAD,)
    partial += tl.where(lead, b2 + x, 0.0)
    row = sum2_ptr + (layer * SUM2_REPLICAS + pid % SUM2_REPLICAS) * D
    tl.atomic_add(row + dim, partial, mask=dim_ok, sem="relaxed", scope="gpu")


@triton.jit
def _logits_phase(
    pid, counter_ptr, error_ptr, target, predict_w_ptr, norm2_w_ptr, norm2_b_ptr, sum2_ptr, logits_ptr,
    D: tl.constexpr, D_PAD: tl.constexpr, VOCAB: tl.constexpr, LAYERS: tl.constexpr, BN: tl.constexpr,
    SUM2_STRIDE: tl.constexpr, EPS: tl.constexpr, SYNC: tl.constexpr, ASM: tl.constexpr, SUM2_REPLICAS: tl.constexpr,
    timeline_ptr, TIMELINE: tl.constexpr, STREAM_EVICT: tl.constexpr, HOIST: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    _grid_arrive(counter_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)  # arrive-first: before the tile loads
    col = pid * BN + tl.arange(0, BN)
    col_ok = col < VOCAB
    dim = tl.arange(0, D_PAD)
    dim_ok = dim < D
    w = tl.load(predict_w_ptr + col[:, None] * D + dim[None, :], mask=col_ok[:, None] & dim_ok[None, :], other=0.0,
                eviction_policy=STREAM_EVICT)
    norm_w, norm_b = norm2_w_ptr + (LAYERS - 1) * D, norm2_b_ptr + (LAYERS - 1) * D
    gamma, beta = _norm_params(norm_w, norm_b, dim, dim_ok, HOIST)

    _grid_barrier(counter_ptr, error_ptr, target, SYNC, ASM, timeline_ptr, TIMELINE)

    summed = _replica_sum(sum2_ptr + (LAYERS - 1) * SUM2_STRIDE, dim, dim_ok, D, SUM2_REPLICAS)
    x = _phase_layer_norm(summed, dim_ok, gamma, beta, norm_w, norm_b, dim, D, EPS, HOIST, ONE_PASS)
    tl.store(logits_ptr + col, tl.sum(w.to(tl.float32) * x[None, :], axis=1), mask=col_ok)


@triton.jit
def _t2s_step_kernel(
    counter_ptr, error_ptr, last_token_ptr, audio_pos_ptr, cache_len_ptr, embedding_ptr, positions_ptr,
    qkv_w_ptr, qkv_b_ptr, out_w_ptr, out_b_ptr, ffn1_w_ptr, ffn1_b_ptr, ffn2_w_ptr, ffn2_b_ptr,
    norm1_w_ptr, norm1_b_ptr, norm2_w_ptr, norm2_b_ptr, predict_w_ptr,
    cache_ptr, cache_layer_stride, xin_ptr, part_m_ptr, part_s_ptr, part_acc_ptr, sum1_ptr, normed1_ptr,
    hidden_ptr, sum2_ptr, logits_ptr, scale, phase_layer,
    D: tl.constexpr, D_PAD: tl.constexpr, H: tl.constexpr, H_PAD: tl.constexpr, HD: tl.constexpr,
    HD_PAD: tl.constexpr, FFN: tl.constexpr, FFN_PAD: tl.constexpr, VOCAB: tl.constexpr, LAYERS: tl.constexpr,
    PROGRAMS: tl.constexpr, CHUNKS: tl.constexpr, PARTS_PAD: tl.constexpr, CHUNK_MAX: tl.constexpr,
    BLOCK_L: tl.constexpr, MAX_LEN: tl.constexpr, MAX_POSITION: tl.constexpr,
    BN_OUT: tl.constexpr, BN_FFN1: tl.constexpr, BN_FFN2: tl.constexpr, BN_VOCAB: tl.constexpr,
    FOLD_FFN: tl.constexpr, PHASES: tl.constexpr, SUM2_STRIDE: tl.constexpr, EPS: tl.constexpr,
    PHASE: tl.constexpr, ASM_BARRIER: tl.constexpr, arrivals_ptr, FOLD_OUT: tl.constexpr, SUM1_STRIDE: tl.constexpr,
    PREFETCH_OUT: tl.constexpr, SUM1_REPLICAS: tl.constexpr, SUM2_REPLICAS: tl.constexpr, q_ptr,
    LATE_KEY_SCORE: tl.constexpr, SPLIT_OUT: tl.constexpr, OUT_ROWS: tl.constexpr, OUT_GROUPS: tl.constexpr,
    timeline_ptr, TIMELINE: tl.constexpr, STREAM_EVICT: tl.constexpr, OUT_EVICT: tl.constexpr,
    PREFETCH_L2: tl.constexpr, HOIST_LOADS: tl.constexpr, ONE_PASS_NORM: tl.constexpr,
):
    """PHASE == PERSISTENT: the whole step with grid barriers. Otherwise only that phase of layer
    ``phase_layer``, without barriers (the interpreter's path; the launch boundary orders phases).
    PHASES a layer: 4 - FOLD_FFN - FOLD_OUT. FOLD_FFN: one FFN phase, sum 2 a row per layer
    (SUM2_STRIDE = SUM2_REPLICAS x D) that the programs add into; else one sum 2 row, rewritten each
    layer (SUM2_STRIDE 0). FOLD_OUT: no out phase, sum 1 a row per layer (SUM1_STRIDE = SUM1_REPLICAS
    x D) that the heads' last programs add into; else one sum 1 row (SUM1_STRIDE 0). SUMn_REPLICAS: a
    folded sum's row is that many rows of D that different programs add into, summed where it is
    read (1 when unfolded)."""
    pid = tl.program_id(0)
    if PHASE == -1:
        # TIMELINE: (events, PROGRAMS) stamps (step_timeline.py reads them): each grid barrier's arrival and
        # release, then each layer's two attend stamps, then the end of the step.
        layer_stamps = timeline_ptr + 2 * (LAYERS * PHASES + 1) * PROGRAMS
        if PREFETCH_L2:
            _prefetch_ffn_tile(pid, 0, ffn1_w_ptr, ffn2_w_ptr, D, D_PAD, FFN, BN_FFN1)
        for layer in range(LAYERS):
            # Barrier n (1-based) waits for n x PROGRAMS arrivals; every phase has one (at layer 0's
            # attend phase it costs a microsecond and keeps the count uniform).
            first = layer * PHASES + 1
            layer_sum1 = sum1_ptr + layer * SUM1_STRIDE
            _attend_phase(pid, layer, counter_ptr, error_ptr, first * PROGRAMS, last_token_ptr, audio_pos_ptr,
                          cache_len_ptr, embedding_ptr, positions_ptr, sum2_ptr, norm2_w_ptr, norm2_b_ptr, qkv_w_ptr,
                          qkv_b_ptr, cache_ptr, cache_layer_stride, xin_ptr, part_m_ptr, part_s_ptr, part_acc_ptr,
                          scale, arrivals_ptr, out_w_ptr, out_b_ptr, sum1_ptr, q_ptr, D, D_PAD, H, HD, HD_PAD, CHUNKS,
                          CHUNK_MAX, BLOCK_L, MAX_LEN, MAX_POSITION, SUM2_STRIDE, EPS, True, ASM_BARRIER, FOLD_OUT,
                          PARTS_PAD, PREFETCH_OUT, SUM1_REPLICAS, SUM2_REPLICAS, LATE_KEY_SCORE, SPLIT_OUT, OUT_ROWS,
                          OUT_GROUPS, timeline_ptr, layer_stamps, TIMELINE, STREAM_EVICT, OUT_EVICT, HOIST_LOADS, ONE_PASS_NORM)
            if PREFETCH_L2:  # PREFETCH_L2 (with both folds): each phase asks L2 for the tile after the next one
                if layer + 1 < LAYERS:
                    _prefetch_attend_tile(pid, layer + 1, qkv_w_ptr, cache_ptr, cache_layer_stride, cache_len_ptr, D,
                                          D_PAD, H, HD, HD_PAD, CHUNKS, BLOCK_L, MAX_LEN)
            ffn_barrier = first + 1
            if not FOLD_OUT:
                _out_phase(pid, layer, counter_ptr, error_ptr, (first + 1) * PROGRAMS, out_w_ptr, out_b_ptr, xin_ptr,
                           part_m_ptr, part_s_ptr, part_acc_ptr, sum1_ptr, D, H, H_PAD, HD, HD_PAD, CHUNKS, PARTS_PAD,
                           BN_OUT, True, ASM_BARRIER, timeline_ptr, TIMELINE)
                ffn_barrier = first + 2
            if FOLD_FFN:
                _ffn_phase(pid, layer, counter_ptr, error_ptr, ffn_barrier * PROGRAMS, ffn1_w_ptr, ffn1_b_ptr,
                           ffn2_w_ptr, ffn2_b_ptr, norm1_w_ptr, norm1_b_ptr, layer_sum1, sum2_ptr, D, D_PAD, FFN,
                           BN_FFN1, EPS, True, ASM_BARRIER, SUM1_REPLICAS, SUM2_REPLICAS, timeline_ptr, TIMELINE,
                           STREAM_EVICT, HOIST_LOADS, ONE_PASS_NORM)
                if PREFETCH_L2:
                    if layer + 1 < LAYERS:
                        _prefetch_ffn_tile(pid, layer + 1, ffn1_w_ptr, ffn2_w_ptr, D, D_PAD, FFN, BN_FFN1)
            else:
                _ffn1_phase(pid, layer, counter_ptr, error_ptr, ffn_barrier * PROGRAMS, ffn1_w_ptr, ffn1_b_ptr,
                            norm1_w_ptr, norm1_b_ptr, layer_sum1, normed1_ptr, hidden_ptr, D, D_PAD, FFN, BN_FFN1,
                            EPS, True, ASM_BARRIER, SUM1_REPLICAS, timeline_ptr, TIMELINE, HOIST_LOADS,
                            ONE_PASS_NORM)
                _ffn2_phase(pid, layer, counter_ptr, error_ptr, (ffn_barrier + 1) * PROGRAMS, ffn2_w_ptr, ffn2_b_ptr,
                            hidden_ptr, normed1_ptr, sum2_ptr, D, FFN, FFN_PAD, BN_FFN2, True, ASM_BARRIER,
                            timeline_ptr, TIMELINE)
        _logits_phase(pid, counter_ptr, error_ptr, (LAYERS * PHASES + 1) * PROGRAMS + pid * 0, predict_w_ptr,
                      norm2_w_ptr, norm2_b_ptr, sum2_ptr, logits_ptr, D, D_PAD, VOCAB, LAYERS, BN_VOCAB, SUM2_STRIDE,
                      EPS, True, ASM_BARRIER, SUM2_REPLICAS, timeline_ptr, TIMELINE, STREAM_EVICT, HOIST_LOADS,
                      ONE_PASS_NORM)
        _stamp(layer_stamps, 2 * LAYERS, TIMELINE)  # the step's end
    elif PHASE == 0:
        _attend_phase(pid, phase_layer, counter_ptr, error_ptr, 0, last_token_ptr, audio_pos_ptr, cache_len_ptr,
                      embedding_ptr, positions_ptr, sum2_ptr, norm2_w_ptr, norm2_b_ptr, qkv_w_ptr, qkv_b_ptr,
                      cache_ptr, cache_layer_stride, xin_ptr, part_m_ptr, part_s_ptr, part_acc_ptr, scale,
                      arrivals_ptr, out_w_ptr, out_b_ptr, sum1_ptr, q_ptr, D, D_PAD, H, HD, HD_PAD, CHUNKS, CHUNK_MAX,
                      BLOCK_L, MAX_LEN, MAX_POSITION, SUM2_STRIDE, EPS, False, False, FOLD_OUT, PARTS_PAD,
                      PREFETCH_OUT, SUM1_REPLICAS, SUM2_REPLICAS, LATE_KEY_SCORE, SPLIT_OUT, OUT_ROWS, OUT_GROUPS,
                      timeline_ptr, timeline_ptr, False, STREAM_EVICT, OUT_EVICT, HOIST_LOADS, ONE_PASS_NORM)
    elif PHASE == 6:
        # SPLIT_OUT's head rows, one launch after the attend phase wrote every partial and the layer input.
        is_chunk, is_key, is_value, head, rank = _program_role(pid, H, CHUNKS)
        if is_chunk | is_key | is_value:
            w, rows, rows_ok = _head_out_rows(out_w_ptr, phase_layer, pid, head, rank, D, HD, HD_PAD, H, CHUNKS,
                                              OUT_ROWS, OUT_GROUPS)
            dim = tl.arange(0, D_PAD)
            x = tl.load(xin_ptr + dim, mask=dim < D, other=0.0)
            _add_head_out_rows(head, rank, phase_layer, x, w, rows, rows_ok, out_b_ptr, part_m_ptr, part_s_ptr,
                               part_acc_ptr, sum1_ptr, D, D_PAD, HD, HD_PAD, CHUNKS, PARTS_PAD, SUM1_REPLICAS,
                               OUT_ROWS, OUT_GROUPS, HOIST_LOADS)
    elif PHASE == 1:
        _out_phase(pid, phase_layer, counter_ptr, error_ptr, 0, out_w_ptr, out_b_ptr, xin_ptr, part_m_ptr,
                   part_s_ptr, part_acc_ptr, sum1_ptr, D, H, H_PAD, HD, HD_PAD, CHUNKS, PARTS_PAD, BN_OUT, False, False,
                   timeline_ptr, False)
    elif PHASE == 2:
        _ffn1_phase(pid, phase_layer, counter_ptr, error_ptr, 0, ffn1_w_ptr, ffn1_b_ptr, norm1_w_ptr, norm1_b_ptr,
                    sum1_ptr + phase_layer * SUM1_STRIDE, normed1_ptr, hidden_ptr, D, D_PAD, FFN, BN_FFN1, EPS,
                    False, False, SUM1_REPLICAS, timeline_ptr, False, HOIST_LOADS, ONE_PASS_NORM)
    elif PHASE == 3:
        _ffn2_phase(pid, phase_layer, counter_ptr, error_ptr, 0, ffn2_w_ptr, ffn2_b_ptr, hidden_ptr, normed1_ptr,
                    sum2_ptr, D, FFN, FFN_PAD, BN_FFN2, False, False, timeline_ptr, False)
    elif PHASE == 5:
        _ffn_phase(pid, phase_layer, counter_ptr, error_ptr, 0, ffn1_w_ptr, ffn1_b_ptr, ffn2_w_ptr, ffn2_b_ptr,
                   norm1_w_ptr, norm1_b_ptr, sum1_ptr + phase_layer * SUM1_STRIDE, sum2_ptr, D, D_PAD, FFN, BN_FFN1,
                   EPS, False, False, SUM1_REPLICAS, SUM2_REPLICAS, timeline_ptr, False, STREAM_EVICT, HOIST_LOADS,
                   ONE_PASS_NORM)
    else:
        _logits_phase(pid, counter_ptr, error_ptr, 0, predict_w_ptr, norm2_w_ptr, norm2_b_ptr, sum2_ptr, logits_ptr,
                      D, D_PAD, VOCAB, LAYERS, BN_VOCAB, SUM2_STRIDE, EPS, False, False, SUM2_REPLICAS, timeline_ptr,
                      False, STREAM_EVICT, HOIST_LOADS, ONE_PASS_NORM)


def _tile_width(columns: int, programs: int) -> int:
    """Columns a program takes so that ``programs`` programs cover ``columns`` (a power of two)."""
    return triton.next_power_of_2(triton.cdiv(columns, programs))


class PersistentT2SEngine(TritonT2SEngine):
    """``TritonT2SEngine`` whose batch-1 decode step is one persistent kernel (other batches: the
    parent's fused or cuBLAS step).

    ``programs``: the grid, at most the GPU's SM count (every program must be resident for the
    barriers), and at least three per head (a chunk of cached keys, the new key, the new value);
    None: ``DEFAULT_PROGRAMS``, capped at the SM count. ``phased``:
    one launch per phase (required under the Triton interpreter). ``fold_ffn``: the FFN as one phase
    whose partial sums meet through float atomics (three barriers a layer instead of four; float32
    results then vary in their last bits from run to run). ``fold_out``: no out phase; each head's last
    attend program adds that head's share of the out projection into sum 1 with float atomics (one
    barrier a layer fewer; the same caveat). ``prefetch_out`` (with ``fold_out``): every attend program
    loads its head's W_o columns right after its q, k or v product, so that load overlaps its
    attention work and the head's last program does not wait for them after its arrival.
    ``sum_replicas`` (with a fold): each folded sum row is kept as that many rows (sum 1 at most one a
    head), the programs (or heads) adding into them in turn and the readers adding them up, so that
    fewer float atomics queue on one address. ``late_key_score`` (with ``fold_out``): the key program
    loads only W_k and the head's last program scores the new key, so no program holds two weight
    tiles. None of the three pays on the H200 (500 FP16 tokens, one call, docs/results/
    h200_34_t2s_late_key_score.json): tokens/s 3,294 as the default, 3,334 with ``late_key_score``,
    3,358 with 8 replicas, 2,925-3,064 with ``prefetch_out``; all three stayed off (8 replicas pay once
    ``arrive_first`` is on, below). They were tried for
    register pressure, read from an offline compile without the launch's alignment hints; compiled as
    launched, no 8-warp variant spills (scripts/t2s_persistent_registers.py). ``split_out`` (with
    ``fold_out``, instead of the two above): every program of a head loads a few rows of the head's W_o
    columns before the step's barrier, waits at the head's counter for the head's last partial, and adds
    its rows of the head's out projection into sum 1, so no W_o load waits behind the last arrival.

    Chosen by an H100's timeline (module docstring): ``sum_replicas`` None takes DEFAULT_SUM_REPLICAS
    where a phase is folded. ``arrive_first`` (None: with the PTX barrier) arrives at each grid barrier
    before issuing the next tile's loads. ``out_in_l2`` (None: with ``fold_out``) loads the streamed
    weights evict-first and W_o, the one weight loaded after a barrier, evict-last, so it stays in L2
    from step to step. Tried and left off (docs/results/h100_36_t2s_timeline.json): ``relaxed_polls``
    (relaxed poll loads and one acquire fence; slower) and ``prefetch_l2`` (each phase's tile asked of
    L2 a phase early; slower: more requests ahead of the arrival). ``timeline``: every step stamps its
    barriers and attend phases (``step_timeline``). ``hoist_loads`` (on by default; read from the compiled
    kernel's SASS, scripts/t2s_persistent_registers.py's offline compile): the small loads that need no
    result of the phase are issued before the first block barrier that follows them (a LayerNorm's scale
    and shift before the grid barrier, the out bias and the partials' weighted values beside the
    partials' scores). Off, they sit where the arithmetic first needs them, after reductions whose block
    barriers no load crosses: each is then one more memory round trip on the critical path. The head's
    32 KB W_o tile stays after the merge (``_fold_out_of_head`` says why). ``one_pass_norm`` (with
    ``hoist_loads``): each LayerNorm's mean and variance from one reduction (``_phase_layer_norm``); off, as
    4,189 against 4,193 tokens/s side by side on an H100 is within the spread, though the kernel's timeline
    puts each phase 0.13 us shorter a layer (docs/results/h100_37_t2s_one_pass_norm.json). Handing each head's out
    projection to a program that waits for it (the head's value program, whose own work ends early,
    polling the head's counter with W_o loaded after its projection or held from before the barrier)
    was slower than the last arrival making it: 3,739-3,843 and 3,484-3,490 tokens/s against 4,107-4,249
    for the default in the same calls on an H100 (docs/results/h100_37_t2s_value_out_*.json, code at
    commits e8a76ef and 8238da8): by the kernel's timeline, the waiting program's projection ended 6.9
    and 6.4 us after the barrier's release, the last arrival's 5.5 us.

    Four more shapes were measured slower on an H100 and removed (docs/results/h100_38_t2s_*.json; their
    tokens equal the fused FP16 step's): every program projecting its own partial by W_o, so the last arrival
    only weighs rows of D (3,408-3,466 tokens/s against 4,105; commit 4ff46bd); every head program issuing the
    W_o tile's loads just before counting its arrival, whose release fence then waits for them (3,586 against
    4,185; 11894ef); ``split_out`` storing its rows into a sum 1 row per head instead of adding them (4,033
    against 4,223: the attend phase 0.75 us shorter, the FFN barrier's release 0.5 us longer; dc3426f); and
    the grid barrier's arrivals spread over 4 or 8 counters, one polling lane each (4,080 and 3,988 against
    4,187; d9fe89c). A fifth, partials written as epoch-tagged 8-byte values that the head's value program
    polls, with no fence or counter between them and its merge (b0bda63), matched the plain step's logits
    in the interpreter but not on the GPU (wrong from the first step; the cause was not found), and its
    timeline put the attend phase at 7.97 us against 7.26: removed too."""

    def __init__(self, weights: T2SWeights, *args, programs: int | None = None, step_warps: int = 8,
                 attention_block: int = 128, phased: bool = False, asm_barrier: bool = True, fold_ffn: bool = True,
                 fold_out: bool = True, prefetch_out: bool = False, sum_replicas: int | None = None,
                 late_key_score: bool = False, split_out: bool = False, timeline: bool = False,
                 relaxed_polls: bool = False, out_in_l2: bool | None = None, prefetch_l2: bool = False,
                 arrive_first: bool | None = None, hoist_loads: bool = True, one_pass_norm: bool = False,
                 **kwargs):
        if sum_replicas is None:  # the default where a phase is folded, else one row
            sum_replicas = DEFAULT_SUM_REPLICAS if fold_ffn or fold_out else 1
        if not isinstance(sum_replicas, int) or sum_replicas < 1:
            raise ValueError(f"sum_replicas {sum_replicas!r} must be an int >= 1")
        if sum_replicas > 1 and not (fold_ffn or fold_out):
            raise ValueError("sum_replicas spreads the atomics of a folded phase: it needs fold_ffn or fold_out")
        if (prefetch_out or late_key_score or split_out) and not fold_out:
            raise ValueError("prefetch_out, late_key_score and split_out change the folded out phase: they need "
                             "fold_out=True")
        arrive_first = asm_barrier if arrive_first is None else arrive_first  # None: with the PTX barrier
        if (relaxed_polls or arrive_first) and not asm_barrier:
            raise ValueError("relaxed_polls and arrive_first change the inline-PTX barrier: they need "
                             "asm_barrier=True")
        if prefetch_l2 and not (fold_out and fold_ffn):
            raise ValueError("prefetch_l2 asks L2 for the attend and FFN tiles a phase early: it needs fold_ffn=True "
                             "and fold_out=True")
        if out_in_l2 and not fold_out:
            raise ValueError("out_in_l2 keeps the folded out projection's W_o in L2: it needs fold_out=True")
        out_in_l2 = fold_out if out_in_l2 is None else out_in_l2  # None: wherever the out phase is folded
        if one_pass_norm and not hoist_loads:
            raise ValueError("one_pass_norm is a form of the hoisted LayerNorm: it needs hoist_loads=True")
        if split_out and (prefetch_out or late_key_score):
            raise ValueError("split_out shares each head's out projection among its programs: it replaces "
                             "prefetch_out and late_key_score, which change the head's last program")
        super().__init__(weights, *args, **kwargs)
        config = self.config
        heads = config.num_heads
        on_gpu = self.device.type == "cuda"
        sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count if on_gpu else None
        if programs is None:
            programs = min(DEFAULT_PROGRAMS, sm_count or DEFAULT_PROGRAMS)
        if programs < self.least_programs(heads):
            raise ValueError(f"programs {programs} must be >= {self.least_programs(heads)} for {heads} heads "
                             "(per head: a chunk, the new k, the new v)")
        if on_gpu and not phased and programs > sm_count:
            raise ValueError(f"programs {programs} exceed the {sm_count} SMs: the grid barrier needs all resident")
        self.programs = programs
        self.step_warps = step_warps
        self.phased = phased
        self.asm_barrier = asm_barrier
        self.fold_ffn, self.fold_out, self.prefetch_out = fold_ffn, fold_out, prefetch_out
        self.late_key_score, self.split_out = late_key_score, split_out
        self.relaxed_polls, self.out_in_l2, self.prefetch_l2 = relaxed_polls, out_in_l2, prefetch_l2
        self.arrive_first, self.hoist_loads, self.one_pass_norm = arrive_first, hoist_loads, one_pass_norm
        # Unfolded sums are written whole by one program per column: nothing to spread. Sum 1 has one
        # adder a head, so more replicas than heads would stay zero.
        self.sum1_replicas = min(sum_replicas, heads) if fold_out else 1
        self.sum2_replicas = sum_replicas if fold_ffn else 1
        self.chunks = programs // heads - 2
        self.step_block = attention_block
        # One stacked tensor per parameter kind, (layers, ...); each per-layer field becomes a view
        # of it as soon as it is copied, so the parent's paths read the same memory and a layer's
        # own tensor is freed at once (the peak holds one kind twice, not the whole model).
        names = ("qkv_weight", "qkv_bias", "out_weight", "out_bias", "ffn1_weight", "ffn1_bias", "ffn2_weight",
                 "ffn2_bias", "norm1_weight", "norm1_bias", "norm2_weight", "norm2_bias")
        self.stacked = {}
        for name in names:
            first = getattr(weights.layers[0], name)
            stacked = torch.empty((len(weights.layers), *first.shape), dtype=first.dtype, device=first.device)
            for index, layer in enumerate(weights.layers):
                stacked[index].copy_(getattr(layer, name))
                setattr(layer, name, stacked[index])
            self.stacked[name] = stacked
        d, ffn = config.hidden_dim, config.ffn_dim

        def scratch(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.float32, device=self.device)

        self._step_xin, self._step_normed1 = scratch(d), scratch(d)
        # What every step starts from zero lives in one buffer, so a step's graph clears it with one
        # memset instead of four (each a graph node with its own launch gap before the step kernel):
        # folded out phase: one sum 1 row (of sum1_replicas x D) per layer and an arrival counter per
        # (layer, head); folded FFN: one sum 2 row (of sum2_replicas x D) per layer that the programs'
        # partials add into; the grid barrier's counter. Unfolded sums are rewritten whole each layer.
        sum1_shape = (config.num_layers, self.sum1_replicas * d) if fold_out else (d,)
        sum2_shape = (config.num_layers, self.sum2_replicas * d) if fold_ffn else (d,)
        arrivals_shape = (config.num_layers if fold_out else 1, heads)
        sizes = [math.prod(shape) for shape in (sum1_shape, sum2_shape, arrivals_shape, (1,))]
        self._step_zeroed = torch.zeros(sum(sizes), dtype=torch.int32, device=self.device)
        sum1, sum2, arrivals, barrier = torch.split(self._step_zeroed, sizes)
        self._step_sum1 = sum1.view(torch.float32).view(sum1_shape)  # int32 and float32: the same 4 bytes
        self._step_sum2 = sum2.view(torch.float32).view(sum2_shape)
        self._head_arrivals = arrivals.view(arrivals_shape)
        self._barrier = barrier
        self._step_hidden, self._step_logits = scratch(ffn), scratch(1, config.vocab_size)
        # late_key_score: each head's q, for its new key's score (otherwise never written).
        self._step_q = scratch(heads, config.head_dim) if late_key_score else scratch(1)
        self._part_m, self._part_s = scratch(heads, self.chunks + 1), scratch(heads, self.chunks + 1)
        self._part_acc = scratch(heads, self.chunks + 1, config.head_dim)
        self._barrier_error = torch.zeros(1, dtype=torch.int32, device=self.device)
        # timeline: every step's kernel overwrites its stamps (step_timeline.py's layout); a placeholder otherwise.
        stamps = self.step_layout.events if timeline else 1
        self._timeline = torch.zeros((stamps, programs if timeline else 1), dtype=torch.int64, device=self.device)
        self.timeline = timeline

    @staticmethod
    def least_programs(heads: int) -> int:
        """The smallest grid with a program for every role of every head: a chunk, the new k, the new v."""
        return 3 * heads

    @property
    def phase_names(self) -> tuple[str, ...]:
        """A layer's phases, each opened by a grid barrier: attend, out (unless folded), one FFN phase or two."""
        return ("attend",) + (() if self.fold_out else ("out",)) + (("ffn",) if self.fold_ffn else ("ffn1", "ffn2"))

    @property
    def step_layout(self) -> StepLayout:
        """Which row of the timeline's stamp table holds which event, for this engine's phases and grid."""
        return StepLayout(self.config.num_layers, self.phase_names, self.programs)

    def program_roles(self) -> list[str]:
        """Each program's role in the attend phase (``_program_role``): chunk, key, value or idle."""
        heads = self.config.num_heads
        return [("chunk" if pid < heads * self.chunks else "key" if pid < heads * (self.chunks + 1)
                 else "value" if pid < heads * (self.chunks + 2) else "idle") for pid in range(self.programs)]

    def step_timeline(self) -> torch.Tensor:
        """(events, programs) int64 on the host: the last persistent step's stamps, in nanoseconds of the
        GPU's global timer (``timeline=True`` only; layout in models/gpt_sovits/step_timeline.py)."""
        if not self.timeline:
            raise RuntimeError("step_timeline needs an engine built with timeline=True")
        if self.phased:
            raise RuntimeError("a phased engine launches no persistent kernel, so nothing stamps the timeline")
        return self._timeline.cpu()

    def barrier_timed_out(self) -> bool:
        """Whether any barrier gave up waiting (a grid larger than what fits at once)."""
        return bool(self._barrier_error.item())

    def kernel_constants(self, phase: int) -> dict:
        """The step kernel's compile-time arguments (its constexprs) for ``phase``: what ``_launch``
        passes, and what scripts/t2s_persistent_registers.py compiles offline."""
        config = self.config
        d, heads, head_dim, ffn = config.hidden_dim, config.num_heads, config.head_dim, config.ffn_dim
        chunk_max = triton.cdiv(self.max_len, self.chunks)
        # split_out: the W_o rows of a head go to its first programs, a power of two of them (at most
        # its CHUNKS + 2), D_PAD / that many rows each.
        out_groups = min(1 << ((self.chunks + 2).bit_length() - 1), triton.next_power_of_2(d))
        return dict(
            D=d, D_PAD=triton.next_power_of_2(d), H=heads, H_PAD=triton.next_power_of_2(heads), HD=head_dim,
            HD_PAD=triton.next_power_of_2(head_dim), FFN=ffn, FFN_PAD=triton.next_power_of_2(ffn),
            VOCAB=config.vocab_size, LAYERS=config.num_layers, PROGRAMS=self.programs, CHUNKS=self.chunks,
            PARTS_PAD=triton.next_power_of_2(self.chunks + 1), CHUNK_MAX=chunk_max,
            BLOCK_L=min(self.step_block, triton.next_power_of_2(chunk_max)), MAX_LEN=self.max_len,
            MAX_POSITION=POSITION_TABLE_LEN,
            BN_OUT=_tile_width(d, self.programs), BN_FFN1=_tile_width(ffn, self.programs),
            BN_FFN2=_tile_width(d, self.programs), BN_VOCAB=_tile_width(config.vocab_size, self.programs),
            FOLD_FFN=self.fold_ffn, PHASES=len(self.phase_names),
            SUM2_STRIDE=self.sum2_replicas * d if self.fold_ffn else 0, EPS=LAYER_NORM_EPS, PHASE=phase,
            ASM_BARRIER=(ASM_PTX * self.asm_barrier) | (ASM_RELAXED * self.relaxed_polls)
            | (ASM_ARRIVE_FIRST * self.arrive_first), FOLD_OUT=self.fold_out,
            SUM1_STRIDE=self.sum1_replicas * d if self.fold_out else 0, PREFETCH_OUT=self.prefetch_out,
            SUM1_REPLICAS=self.sum1_replicas, SUM2_REPLICAS=self.sum2_replicas, LATE_KEY_SCORE=self.late_key_score,
            SPLIT_OUT=self.split_out, OUT_GROUPS=out_groups, OUT_ROWS=triton.next_power_of_2(d) // out_groups,
            TIMELINE=self.timeline and phase == PERSISTENT,
            STREAM_EVICT="evict_first" if self.out_in_l2 else "", OUT_EVICT="evict_last" if self.out_in_l2 else "",
            PREFETCH_L2=self.prefetch_l2 and phase == PERSISTENT, HOIST_LOADS=self.hoist_loads,
            ONE_PASS_NORM=self.one_pass_norm)

    def _launch(self, phase: int, layer: int) -> None:
        w, s = self.weights, self.stacked
        cache = self.kv_cache  # (layers, slots, max_len, 2d); slot 0 is the batch-1 row
        _t2s_step_kernel[(self.programs,)](
            self._barrier, self._barrier_error, self.last_token, self.audio_pos, self.cache_len,
            w.audio_embedding, w.audio_positions,
            s["qkv_weight"], s["qkv_bias"], s["out_weight"], s["out_bias"], s["ffn1_weight"], s["ffn1_bias"],
            s["ffn2_weight"], s["ffn2_bias"], s["norm1_weight"], s["norm1_bias"], s["norm2_weight"], s["norm2_bias"],
            w.predict_weight, cache, cache.stride(0), self._step_xin, self._part_m, self._part_s, self._part_acc,
            self._step_sum1, self._step_normed1, self._step_hidden, self._step_sum2, self._step_logits,
            1.0 / math.sqrt(self.config.head_dim), layer, arrivals_ptr=self._head_arrivals, q_ptr=self._step_q,
            timeline_ptr=self._timeline,
            num_warps=self.step_warps, **self.kernel_constants(phase),
        )

    @torch.no_grad()
    def decode_step(self, batch: int, cache_bucket: int, greedy: bool) -> None:
        if batch != 1:
            super().decode_step(batch, cache_bucket, greedy)
            return
        self._step_zeroed.zero_()  # the folded sums, the head arrivals and the barrier counter
        if self.phased:
            phases = ((PHASE_ATTEND,) + ((PHASE_HEAD_OUT,) if self.split_out else ())
                      + (() if self.fold_out else (PHASE_OUT,))
                      + ((PHASE_FFN,) if self.fold_ffn else (PHASE_FFN1, PHASE_FFN2)))
            for layer in range(self.config.num_layers):
                for phase in phases:
                    self._launch(phase, layer)
            self._launch(PHASE_LOGITS, 0)
        else:
            self._launch(PERSISTENT, 0)
        self._record(1, self._step_logits, greedy)
