"""The T2S decode step at batch 1 as one CUDA C++ kernel of thread-block clusters (sm_90 and later).

``engine_persistent``'s Triton step spends about a third of each layer combining a head's softmax
partials: every program releases its partial to L2 and counts its arrival, and the head's last
program loads the partials back, then the head's 32 KB W_o tile, before its product; a chain of
memory round trips that Triton's programs cannot shorten (no shared memory between programs). Here
(``t2s_cluster_step.cu``) each head is a cluster of CTAs: the head's q, k and v rows and its partials
meet in distributed shared memory behind the cluster's hardware barrier, each CTA applies rows of W_o
it knows in advance, and every weight tile is copied into shared memory a phase ahead.

The kernel is compiled on first use with NVRTC (``core/cuda_source.py``; PyTorch's CUDA wheels bring
it) and launched on PyTorch's stream, so the engine's CUDA graphs capture it like the Triton step.
Other batches, and everything around the step (prefill, the choice kernel, the buffers that each
step zeroes), are ``PersistentT2SEngine``'s.

Measured on an H100 (full-size random weights, 500 greedy FP16 tokens, median of 5,
scripts/sweep_t2s_persistent.py; every row's tokens equal the fused FP16 step's):

- clusters of 4 CTAs, 8 sum replicas, bulk copies (the defaults): **4,503 and 4,483 tokens/s** in two
  calls, against 4,158 and 4,237 for the Triton step in the same calls (docs/results/
  h100_39_t2s_cluster_sizes_replicas.json, h100_39_t2s_cluster_final.json);
- clusters of 8 fit only as two CTAs an SM (an H100 holds 15 clusters of 8 at one CTA an SM, one short
  of a cluster a head): 4,230 against 4,456 for clusters of 4, 4 replicas, same call;
- ``copies="after"`` 4,014-4,053 and ``"before"`` 3,727-3,794: issuing ~4,000 16-byte cp.async copies a
  phase costs about 0.8 us where it stands, and ahead of the grid barrier's poll it made each barrier
  2 us instead of 1 (the kernel's own stamps, ``timeline=True``);
- bulk copies of the cached keys and values too (a 64-byte run a position, one bulk copy each) took
  the copy engine ~12 us a phase: 1,350 tokens/s (docs/results/h100_39_t2s_cluster_bulk_copies.json);
  those stay cp.async copies.

    engine = ClusterT2SEngine(weights, max_batch=1, max_len=640, length_buckets=[640])
"""
from __future__ import annotations

import ctypes
import functools
import math
import re
import statistics
from pathlib import Path

import torch

from core.cuda_source import (
    CompiledCuda,
    Float32,
    Int64,
    LoadedKernel,
    Pointer,
    compile_cuda,
)
from models.gpt_sovits.engine_persistent import PERSISTENT, PersistentT2SEngine
from models.gpt_sovits.engine_weights import LAYER_NORM_EPS, POSITION_TABLE_LEN, T2SWeights
from models.gpt_sovits.t2s import T2SConfig

SOURCE = Path(__file__).with_name("t2s_cluster_step.cu")
KERNEL_NAME = "t2s_cluster_step"
# CTAs a head, tried in order until every head's cluster fits at once: 4 first (faster than 8 on an
# H100, where clusters of 8 fit only two CTAs to an SM: 15 fit at one CTA an SM), then 8.
CLUSTER_SIZES = (4, 8)
THREADS = 256
KV_BLOCK = 256  # cached positions a CTA's shared memory holds at once (longer chunks loop)
SPIN_LIMIT = 1 << 22  # polls before a grid barrier gives up: far beyond any real wait (~1 us)
ARCH = "sm_90"
# How each phase's tiles reach shared memory, a phase ahead (engine docstring): cp.async copies issued
# before the grid barrier, or after its release, or bulk copies of repacked tiles after its release.
COPIES = ("before", "after", "bulk")
# The source's ``Stamp`` events of a layer, in order (``timeline=True``).
STAMP_NAMES = ("attend_released", "input_normed", "qkv_done", "gathered", "partial_done", "merged", "out_added",
               "ffn_released", "ffn_normed", "hidden_done", "ffn_added")


class _Weights(ctypes.Structure):
    """The kernel's ``Weights`` argument: device addresses, in the source's field order."""
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "qkv_w", "qkv_b", "out_w", "out_b", "ffn1_w", "ffn1_b", "ffn2_w", "ffn2_b", "norm1_w", "norm1_b",
        "norm2_w", "norm2_b", "predict_w", "embedding", "positions", "out_heads", "ffn2_t")]


def unsupported_reason(config: T2SConfig, cluster: int = CLUSTER_SIZES[0]) -> str | None:
    """Why the kernel with ``cluster`` CTAs a head cannot take this configuration (its thread mapping is
    fixed in the source), or None."""
    heads, ctas = config.num_heads, config.num_heads * cluster
    if config.head_dim != 32:
        return f"head_dim {config.head_dim}: the kernel maps a head's 32 dimensions onto a warp's lanes"
    if config.hidden_dim != 2 * THREADS:
        return f"hidden_dim {config.hidden_dim}: the kernel holds a row as two values per thread of {THREADS}"
    if config.ffn_dim % (8 * ctas):
        return f"ffn_dim {config.ffn_dim}: the kernel gives each of {ctas} CTAs ({heads} heads x {cluster}) a multiple of 8 units"
    if config.head_dim % cluster or (THREADS // (config.hidden_dim // cluster)) * 8 > config.head_dim:
        return f"{cluster} CTAs a head: the q, k, v rows or the W_o rows' 16-byte runs do not split evenly"
    return None


def kernel_defines(config: T2SConfig, max_len: int, sum1_replicas: int, sum2_replicas: int,
                   cluster: int, timeline: bool = False, copies: str = "bulk") -> dict[str, object]:
    """The source's compile-time constants for a model configuration, cache length and cluster size."""
    return dict(D=config.hidden_dim, H=config.num_heads, HD=config.head_dim, FFN=config.ffn_dim,
                VOCAB=config.vocab_size, LAYERS=config.num_layers, CLUSTER=cluster, KV_BLOCK=KV_BLOCK,
                REPLICAS_1=sum1_replicas, REPLICAS_2=sum2_replicas, MAX_LEN=max_len, MAX_POSITION=POSITION_TABLE_LEN,
                SPIN_LIMIT=f"{SPIN_LIMIT}LL", EPS=f"{LAYER_NORM_EPS!r}f", TIMELINE=int(timeline),
                COPY_AFTER_RELEASE=int(copies == "after"), BULK_COPIES=int(copies == "bulk"))


@functools.lru_cache(maxsize=8)
def compile_step(defines: tuple[tuple[str, object], ...], arch: str = ARCH) -> CompiledCuda:
    """The step's cubin for ``arch`` (cached per set of constants). Needs NVRTC, not a GPU."""
    return compile_cuda(SOURCE.read_text(), arch, dict(defines), name=SOURCE.name, options=("-lineinfo",))


def shared_bytes(compiled: CompiledCuda) -> int:
    """The dynamic shared memory the kernel's layout needs: ``shared_bytes_layout``'s initialiser in the PTX."""
    match = re.search(r"shared_bytes_layout\s*=\s*(\d+)", compiled.ptx)
    if match is None:
        raise ValueError("the compiled step carries no shared_bytes_layout constant")
    return int(match.group(1))


class ClusterT2SEngine(PersistentT2SEngine):
    """``PersistentT2SEngine`` whose batch-1 step is the cluster kernel (module docstring).

    FP16 weights on a GPU of compute capability 9.0 or later. ``cluster``: CTAs a head, None for the
    first of ``CLUSTER_SIZES`` whose clusters, one a head, all fit on the GPU at once (the grid barrier
    needs every CTA resident; checked at build either way). ``sum_replicas``: as
    ``PersistentT2SEngine``'s, rows that the folded sums are kept in (sum 1 at most one a head)."""

    def __init__(self, weights: T2SWeights, *args, cluster: int | None = None, sum_replicas: int | None = None,
                 timeline: bool = False, copies: str = "bulk", **kwargs):
        if copies not in COPIES:
            raise ValueError(f"copies {copies!r}: use one of {COPIES}")
        sizes = CLUSTER_SIZES if cluster is None else (cluster,)
        reasons = {size: unsupported_reason(weights.config, size) for size in sizes}
        if all(reasons.values()):
            raise ValueError(f"the cluster step cannot run this model: {'; '.join(reasons.values())}")
        if weights.dtype != torch.float16:
            raise ValueError(f"the cluster step reads FP16 weights, got {weights.dtype}")
        if weights.device.type != "cuda":
            raise ValueError("the cluster step is a CUDA kernel: build the engine on a GPU")
        capability = torch.cuda.get_device_capability(weights.device)
        if capability < (9, 0):
            raise ValueError(f"thread-block clusters need compute capability 9.0, this GPU has {capability}")
        triton_only = sorted(knob for knob in ("phased", "split_out", "prefetch_out", "late_key_score")
                             if kwargs.get(knob))
        if triton_only:
            raise ValueError(f"{', '.join(triton_only)}: knobs of the Triton step, not of the cluster step")
        if kwargs.pop("fold_ffn", True) is False or kwargs.pop("fold_out", True) is False:
            raise ValueError("the cluster step always folds its out projection and its FFN")
        heads = weights.config.num_heads
        # The parent's grid only sizes buffers this step does not use; the CTAs are set below.
        super().__init__(weights, *args, programs=3 * heads, sum_replicas=sum_replicas, fold_ffn=True,
                         fold_out=True, **kwargs)
        fitting = {}
        for size in (size for size in sizes if not reasons[size]):
            defines = kernel_defines(self.config, self.max_len, self.sum1_replicas, self.sum2_replicas, size,
                                     timeline, copies)
            compiled = compile_step(tuple(sorted(defines.items())))
            kernel = LoadedKernel(compiled.cubin, KERNEL_NAME, self.device.index or 0, shared_bytes(compiled))
            fitting[size] = kernel.max_active_clusters(heads * size, THREADS)
            if fitting[size] >= heads:
                self.cluster, self.kernel, self.defines = size, kernel, defines
                break
        else:
            raise ValueError(f"clusters resident at once {fitting} (CTAs a head: clusters); the step needs {heads}, "
                             "one a head")
        self.resident_clusters = fitting[self.cluster]
        self.programs = heads * self.cluster
        self.stamped = timeline
        # timeline: (layers, STAMP_NAMES, CTAs) global-timer stamps of the last step (a placeholder otherwise).
        stamp_shape = (self.config.num_layers, len(STAMP_NAMES), self.programs) if timeline else (1,)
        self._stamps = torch.zeros(stamp_shape, dtype=torch.int64, device=self.device)
        w, s = weights, self.stacked
        for tensor in (*s.values(), w.predict_weight, w.audio_embedding, w.audio_positions):
            if not tensor.is_contiguous():
                raise ValueError("the cluster step indexes contiguous weights")
        # Bulk copies: W_o as (layers, heads, D, head_dim) and W_2 transposed, so that each CTA's tile of
        # either is one contiguous run; copies the engine holds beside the stacked weights (63 MB in FP16
        # at the official shapes).
        self._out_heads = self._ffn2_t = None
        if copies == "bulk":
            layers, d, head_dim = self.config.num_layers, self.config.hidden_dim, self.config.head_dim
            self._out_heads = (s["out_weight"].view(layers, d, heads, head_dim).permute(0, 2, 1, 3).contiguous())
            self._ffn2_t = s["ffn2_weight"].transpose(1, 2).contiguous()
        repacked = [0 if t is None else t.data_ptr() for t in (self._out_heads, self._ffn2_t)]
        self._weights_arg = _Weights(*[t.data_ptr() for t in (
            s["qkv_weight"], s["qkv_bias"], s["out_weight"], s["out_bias"], s["ffn1_weight"], s["ffn1_bias"],
            s["ffn2_weight"], s["ffn2_bias"], s["norm1_weight"], s["norm1_bias"], s["norm2_weight"],
            s["norm2_bias"], w.predict_weight, w.audio_embedding, w.audio_positions)], *repacked)
        # Every argument is a buffer allocated once (or a constant): built here, not at each launch.
        cache = self.kv_cache  # (layers, slots, max_len, 2d); slot 0 is the batch-1 row
        self._launch_args = [
            self._weights_arg, Pointer(cache), Int64(cache.stride(0)), Pointer(self.last_token),
            Pointer(self.audio_pos), Pointer(self.cache_len), Pointer(self._step_sum1), Pointer(self._step_sum2),
            Pointer(self._step_logits), Pointer(self._barrier), Pointer(self._barrier_error),
            Float32(1.0 / math.sqrt(self.config.head_dim)), Pointer(self._stamps)]

    def _launch(self, phase: int, layer: int) -> None:
        if phase != PERSISTENT:
            raise RuntimeError("the cluster step runs whole: it has no phases to launch one by one")
        self.kernel.launch(self.programs, THREADS, self._launch_args, torch.cuda.current_stream(self.device))

    def stamp_summary(self) -> dict[str, float]:
        """Microseconds from each stamped event of a layer to the next (the last: to the next layer's
        release), medians over layers 1..L-2 of the slowest CTA's arrival at each event, for the last step."""
        if not self.stamped:
            raise RuntimeError("stamp_summary needs an engine built with timeline=True")
        stamps = self._stamps.cpu().double()  # (layers, events, CTAs) ns
        latest = stamps.max(dim=2).values  # (layers, events): when the last CTA got there
        flat = latest.flatten()
        gaps = flat[1:] - flat[:-1]  # event e of layer l -> the next event
        events = len(STAMP_NAMES)
        summary = {}
        for index, name in enumerate(STAMP_NAMES):
            per_layer = [float(gaps[layer * events + index]) / 1e3 for layer in range(1, self.config.num_layers - 1)]
            after = STAMP_NAMES[index + 1] if index + 1 < events else "next attend_released"
            summary[f"{name} -> {after}"] = round(statistics.median_high(per_layer), 3)
        summary["layer_us"] = round(float((latest[-2, 0] - latest[1, 0]) / (self.config.num_layers - 3) / 1e3), 3)
        return summary
