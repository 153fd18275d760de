"""A convolution with its elementwise tail run in cuDNN's epilogue, as one PyTorch operator.

    from models.cudnn_epilogue import channels_fastest, conv_lrelu

    weight = channels_fastest(conv.weight.detach())     # (C_out, C_in, K), C_in fastest
    t = conv_lrelu(a, weight, bias, mask, padding=5, dilation=3, slope=0.1)
    a = conv_lrelu(t, weight2, bias2, mask, padding=5, dilation=1, slope=0.1, residual=a, residual_slope=10.0)

computes ``mask * lrelu(conv1d(a, weight, bias) [+ lrelu(residual, residual_slope)], slope)``. Tensors
are (B, C, T) with channels as their fastest dimension (the (N, C, T) view of an NHWC tensor, which
models/conv_layout.py's channels-last convolutions produce), ``mask`` is (B, 1, T), and the output
has the input's layout. Stride-1 convolutions with zero padding on both sides only.

Why: in a HiFi-GAN stage the compiled engine runs each convolution in cuDNN and then one elementwise
kernel for its bias, LeakyReLU, padding mask and residual sum, so every activation crosses memory
once more between two convolutions; in stages 1-3 of EmotiVoice's vocoder those kernels took four
tenths of a block's time on an H100 (scripts/bench_cudnn_fused_resblocks.py --profile). cuDNN's graph API (the
nvidia-cudnn-frontend package) runs the convolution with that tail inside its own epilogue.

On CUDA with the frontend installed, each distinct call (shapes, strides, dtype, padding, dilation,
slopes) builds one cuDNN graph at first use and keeps it. The first graph of each kind (the same call
up to a factor of 4 in rows x length) times every plan cuDNN offers and keeps the fastest; later
graphs of that kind build only the plan of that name (``_EpilogueGraph._plan`` says why). Each graph
is built for its own shape unless ``use_kernel_cache(True)`` makes new ones shape-agnostic, sharing
compiled kernels: cheaper to build, slower to run (``use_kernel_cache`` gives the figures;
``build_stats`` counts what building cost). Launches follow
PyTorch's current stream, so CUDA graphs capture them. Anywhere else the same formula runs in
PyTorch: what the CPU tests compare a vocoder built on it with. torch.compile sees
one opaque call (a fake implementation gives the output's shape) and fuses the code around it.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import math
import threading
import time

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

LIBRARY = "tts"

_graphs: dict[tuple, _EpilogueGraph] = {}
_plan_names: dict[tuple, str] = {}  # graph kind (_run_cudnn) -> the name of its fastest plan
_graphs_lock = threading.Lock()
_handles = threading.local()  # cuDNN handles may not be shared between threads
_kernel_caches: dict[int, object] = {}  # device index -> the cuDNN kernel cache its graphs share
_policy = {"kernel_cache": False}
_winner_ranks: dict[int, int] = {}  # the heuristics' rank of a kind's fastest plan -> kinds
_stats = {"graphs": 0, "build_s": 0.0, "timed_kinds": 0, "plans_timed": 0, "fallbacks": 0,
          "shape_agnostic_failures": 0}


def use_kernel_cache(enabled: bool) -> None:
    """Whether graphs built from now on are shape-agnostic and share one cuDNN kernel cache per device.

    A graph with a fused epilogue runs kernels cuDNN compiles when it builds the graph. Built for one
    shape each (the default), EmotiVoice's engine at batch 1,024 spent 357 s building 816 graphs on
    an H100, timing 1,618 plans for 120 kinds, and then ran 1.05x the engine without the operator.
    Shape-agnostic graphs bind the kernels an earlier shape compiled: the same 816 graphs took 12.7 s,
    but cuDNN offered 5.3 plans a kind instead of 13.5 and the engine ran at 0.82x
    (docs/benchmarks.md, session 48). Hence off by default: what pays to run costs its warm-up."""
    _policy["kernel_cache"] = bool(enabled)


def build_stats() -> dict:
    """What this process's graphs cost to build: ``graphs`` built, ``build_s`` seconds spent building
    them (timing plans included), ``timed_kinds`` kinds whose plans were timed, ``plans_timed`` plans
    timed in all, ``fallbacks`` graphs that found no plan of their kind's name,
    ``shape_agnostic_failures`` graphs cuDNN would not build shape-agnostic (built for their shape
    instead), ``winner_ranks`` how many kinds' fastest plan had each heuristics' rank (0 first: whether
    timing only the first few would do), and ``kernel_cache`` whether new graphs share compiled kernels."""
    return dict(_stats, winner_ranks=dict(sorted(_winner_ranks.items())), kernel_cache=_policy["kernel_cache"])


def build_stats_since(before: dict) -> dict:
    """``build_stats()`` less an earlier ``build_stats()``: what building cost in between."""
    now = build_stats()
    counts = {key: value - before[key] for key, value in now.items()
              if isinstance(value, (int, float)) and not isinstance(value, bool)}
    ranks = {rank: now["winner_ranks"].get(rank, 0) - before["winner_ranks"].get(rank, 0)
             for rank in sorted(set(now["winner_ranks"]) | set(before["winner_ranks"]))}
    return dict(counts, winner_ranks={rank: count for rank, count in ranks.items() if count},
                kernel_cache=now["kernel_cache"])


@functools.cache  # asked on every call of the operator: whether the package is installed does not change
def cudnn_frontend_available() -> bool:
    return importlib.util.find_spec("cudnn") is not None


def channels_fastest(x: torch.Tensor) -> torch.Tensor:
    """A (B, C, T) activation or (C_out, C_in, K) weight with its middle dimension fastest, strides
    (T * C, 1, C), which is what the cuDNN graphs read: ``x`` itself when it already is."""
    batch, channels, steps = x.shape
    if x.stride() == (steps * channels, 1, channels) or channels == 1:
        return x
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def _empty_channels_fastest(like: torch.Tensor, channels: int) -> torch.Tensor:
    batch, _, steps = like.shape
    return torch.empty_strided((batch, channels, steps), (steps * channels, 1, channels), dtype=like.dtype,
                               device=like.device)


def reference(a, weight, bias, mask, residual, padding: int, dilation: int, slope: float, residual_slope: float):
    """The operator's formula in PyTorch, FP32 inside, the input's dtype out, channels fastest."""
    y = F.conv1d(a.float(), weight.float(), bias.float(), padding=padding, dilation=dilation)
    if residual is not None:
        y = y + F.leaky_relu(residual.float(), residual_slope)
    out = _empty_channels_fastest(a, weight.shape[0])
    return out.copy_(F.leaky_relu(y, slope) * mask.float())


def _validate(a, weight, bias, mask, residual, padding: int, dilation: int, slope: float,
              residual_slope: float) -> None:
    if a.dim() != 3 or weight.dim() != 3 or mask.dim() != 3:
        raise ValueError(f"conv_lrelu wants (B, C, T) input, (C_out, C_in, K) weight and (B, 1, T) mask; got "
                         f"{tuple(a.shape)}, {tuple(weight.shape)}, {tuple(mask.shape)}")
    batch, channels, steps = a.shape
    out_channels, in_channels, kernel = weight.shape
    if in_channels != channels or tuple(bias.shape) != (out_channels,) or tuple(mask.shape) != (batch, 1, steps):
        raise ValueError(f"conv_lrelu: input {tuple(a.shape)}, weight {tuple(weight.shape)}, bias "
                         f"{tuple(bias.shape)}, mask {tuple(mask.shape)} do not fit together")
    if 2 * padding != dilation * (kernel - 1):
        raise ValueError(f"conv_lrelu keeps the length: padding {padding} must be dilation {dilation} x "
                         f"(kernel {kernel} - 1) / 2")
    if residual is not None and tuple(residual.shape) != (batch, out_channels, steps):
        raise ValueError(f"conv_lrelu: residual {tuple(residual.shape)} is not the output's "
                         f"{(batch, out_channels, steps)}")
    operands = [weight, bias, mask] + ([] if residual is None else [residual])
    if any(x.dtype != a.dtype or x.device != a.device for x in operands):
        raise ValueError(f"conv_lrelu: every operand in the input's dtype and device ({a.dtype}, {a.device}); got "
                         f"{[(x.dtype, str(x.device)) for x in operands]}")
    # cuDNN's ReLU with a negative slope of 10 computed something else on an H100; slopes in [0, 1) it got right
    if not 0 <= slope < 1 or residual_slope <= 0:
        raise ValueError(f"conv_lrelu: slope {slope} must be in [0, 1) and residual_slope {residual_slope} above 0")


def fastest_plan(timers: list, give_up_factor: float = 4.0) -> int:
    """The index of the fastest plan. ``timers[i](give_up_ms)`` times plan i in milliseconds, or gives inf
    where it cannot run or its first run took longer than ``give_up_ms``: ``give_up_factor`` times the best
    so far. Ties go to the earlier plan (the heuristics rank them); with no plan that runs, 0."""
    times: list[float] = []
    for timer in timers:
        times.append(timer(give_up_factor * min(times, default=math.inf)))
    return min(range(len(times)), key=times.__getitem__) if times and min(times) < math.inf else 0


class _EpilogueGraph:
    """One cuDNN graph: mask * lrelu(conv(a) + bias [+ lrelu(residual, residual_slope)], slope)."""

    def __init__(self, cudnn, handle, a4, w4, b4, m4, r4, out4, padding: int, dilation: int, slope: float,
                 residual_slope: float, kind: tuple, kernel_cache):
        io_type = {torch.float16: cudnn.data_type.HALF, torch.bfloat16: cudnn.data_type.BFLOAT16,
                   torch.float32: cudnn.data_type.FLOAT}[a4.dtype]
        # A kernel cache makes the graph shape-agnostic (the frontend turns dynamic shapes on with it)
        shape_options = {} if kernel_cache is None else {"kernel_cache": kernel_cache}
        graph = cudnn.pygraph(io_data_type=io_type, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle, **shape_options)
        self.image = graph.tensor_like(a4)
        self.weight = graph.tensor_like(w4)
        self.bias = graph.tensor_like(b4)
        self.mask = graph.tensor_like(m4)
        y = graph.conv_fprop(image=self.image, weight=self.weight, padding=[0, padding], stride=[1, 1],
                             dilation=[1, dilation], compute_data_type=cudnn.data_type.FLOAT)
        y = graph.add(a=y, b=self.bias)
        self.residual = self.scale = None
        if r4 is not None:
            self.residual = graph.tensor_like(r4)
            self.scale_value = torch.full((1, 1, 1, 1), float(residual_slope))  # by value: on the host
            self.scale = graph.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT,
                                      is_pass_by_value=True, name="residual_slope")
            scaled = graph.mul(a=self.residual, b=self.scale)
            # lrelu(r, s) as plain arithmetic, min(r, s r) for s >= 1 and max(r, s r) below: cuDNN's ReLU with
            # a negative slope of 10 computed something else on an H100 (scripts/bench_cudnn_fused_resblocks.py)
            pick = graph.min if residual_slope >= 1 else graph.max
            y = graph.add(a=y, b=pick(input0=self.residual, input1=scaled))
        y = graph.mul(a=graph.relu(input=y, negative_slope=slope), b=self.mask)
        y.set_output(True).set_data_type(io_type).set_dim(list(out4.shape)).set_stride(list(out4.stride()))
        self.out = y
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        self.graph, self.device = graph, a4.device
        self._use(self._plan(cudnn, handle, kind, (a4, w4, b4, m4, r4, out4)))

    def _use(self, plan: int) -> None:
        self.plan, self.workspace_bytes = plan, max(self.graph.get_workspace_size_plan_at_index(plan), 1)

    def _plan(self, cudnn, handle, kind: tuple, operands: tuple) -> int:
        """The plan to run. The first graph of a kind (``_run_cudnn``) times every plan cuDNN offers and
        keeps the fastest; later graphs of that kind build only the plan of that name. Why: on an H100 the
        heuristics' first plans ran EmotiVoice's HiFi-GAN stages 1-3 at 0.92-0.97x the compiled blocks'
        speed and the timed ones at 1.06-1.19x (scripts/bench_cudnn_fused_resblocks.py; docs/benchmarks.md,
        session 47)."""
        graph = self.graph
        if kind in _plan_names:
            names = [graph.get_plan_name_at_index(index) for index in range(graph.get_execution_plan_count())]
            if _plan_names[kind] in names:
                index = names.index(_plan_names[kind])
                graph.build_plan_at_index(index)
                return index
            log.warning("cuDNN offers no plan %s for %s at shape %s: the heuristics' first", _plan_names[kind],
                        kind, tuple(operands[0].shape))
            _stats["fallbacks"] += 1
            graph.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)
            return 0
        graph.build_plans(cudnn.build_plan_policy.ALL)
        names = [graph.get_plan_name_at_index(index) for index in range(graph.get_execution_plan_count())]
        best = fastest_plan([lambda give_up_ms, index=index: self._time(handle, index, operands, give_up_ms)
                             for index in range(len(names))])
        _plan_names[kind] = names[best]
        _stats["timed_kinds"] += 1
        _stats["plans_timed"] += len(names)
        _winner_ranks[best] = _winner_ranks.get(best, 0) + 1
        log.info("cuDNN epilogue %s: plan %s, the fastest of %d", kind, names[best], len(names))
        return best

    def _time(self, handle, plan: int, operands: tuple, give_up_ms: float, runs: int = 5) -> float:
        """Milliseconds a run of ``plan`` takes, ``runs`` runs back to back after an untimed one: inf where it
        cannot run, or where one timed run took longer than ``give_up_ms`` (some plans take 100x the best:
        timing them in full would cost seconds)."""
        try:
            self._use(plan)
            self(handle, *operands)  # warm-up: first launches
            for count in (1, runs):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(count):
                    self(handle, *operands)
                end.record()
                end.synchronize()
                if count == 1 and start.elapsed_time(end) > give_up_ms:
                    return math.inf
            return start.elapsed_time(end) / runs
        except Exception:  # noqa: BLE001 -- a plan that fails to run is no candidate (cuDNN raises several types)
            return math.inf

    def __call__(self, handle, a4, w4, b4, m4, r4, out4) -> None:
        pack = {self.image: a4, self.weight: w4, self.bias: b4, self.mask: m4, self.out: out4}
        if self.residual is not None:
            pack[self.residual] = r4
            pack[self.scale] = self.scale_value
        # A workspace per call: graphs captured from one cached cuDNN graph must not share one
        workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=self.device)
        self.graph.execute_plan_at_index(pack, workspace, self.plan, handle=handle)


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """(B, C, T) -> the (B, C, 1, T) view cuDNN reads as NCHW dimensions with x's strides."""
    batch_stride, channel_stride, step_stride = x.stride()
    return x.as_strided((x.shape[0], x.shape[1], 1, x.shape[2]),
                        (batch_stride, channel_stride, x.shape[2] * step_stride, step_stride))


def _handle(cudnn, device: torch.device):
    handles = getattr(_handles, "by_device", None)
    if handles is None:
        handles = _handles.by_device = {}
    if device.index not in handles:
        handles[device.index] = cudnn.create_handle()
    return handles[device.index]


def _kernel_cache(cudnn, device: torch.device):
    if device.index not in _kernel_caches:
        _kernel_caches[device.index] = cudnn.create_kernel_cache()
    return _kernel_caches[device.index]


def _run_cudnn(a, weight, bias, mask, residual, padding: int, dilation: int, slope: float, residual_slope: float):
    import cudnn  # optional: present where the frontend is installed (cudnn_frontend_available)

    a, weight = channels_fastest(a), channels_fastest(weight)
    residual = None if residual is None else channels_fastest(residual)
    mask = mask.contiguous()
    out = _empty_channels_fastest(a, weight.shape[0])
    a4, w4, m4, out4 = _as_4d(a), _as_4d(weight), _as_4d(mask), _as_4d(out)
    b4 = bias.contiguous().view(1, -1, 1, 1)
    r4 = None if residual is None else _as_4d(residual)
    handle = _handle(cudnn, a.device)
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(a.device).cuda_stream)
    # Plans are timed once per kind: the same call up to a factor of 4 in rows x length (the winner may
    # differ between a batch of one and a length group of 32 rows)
    size_class = (a.shape[0] * a.shape[2]).bit_length() // 2
    shape_agnostic = _policy["kernel_cache"]
    kind = (torch.cuda.get_device_name(a.device), a.dtype, tuple(weight.shape), residual is not None, padding,
            dilation, slope, residual_slope, size_class, shape_agnostic)
    key = (a.device.index, tuple(a.shape), tuple(mask.stride())) + kind
    graph = _graphs.get(key)
    if graph is None:
        with _graphs_lock:
            graph = _graphs.get(key)
            if graph is None:
                started = time.perf_counter()
                build_args = (cudnn, handle, a4, w4, b4, m4, r4, out4, padding, dilation, slope, residual_slope,
                              kind)
                if shape_agnostic:
                    try:
                        graph = _EpilogueGraph(*build_args, _kernel_cache(cudnn, a.device))
                    except Exception as error:  # noqa: BLE001 -- cuDNN raises several types; a per-shape one may build
                        log.warning("cuDNN built no shape-agnostic graph for %s at %s (%s): one for this shape",
                                    kind, tuple(a.shape), error)
                        _stats["shape_agnostic_failures"] += 1
                        graph = _EpilogueGraph(*build_args, None)
                else:
                    graph = _EpilogueGraph(*build_args, None)
                _graphs[key] = graph
                _stats["graphs"] += 1
                _stats["build_s"] += time.perf_counter() - started
    graph(handle, a4, w4, b4, m4, r4, out4)
    return out


@torch.library.custom_op(f"{LIBRARY}::conv_lrelu", mutates_args=())
def _conv_lrelu(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor,
                residual: torch.Tensor | None, padding: int, dilation: int, slope: float,
                residual_slope: float) -> torch.Tensor:
    if a.is_cuda and cudnn_frontend_available():
        return _run_cudnn(a, weight, bias, mask, residual, padding, dilation, slope, residual_slope)
    return reference(a, weight, bias, mask, residual, padding, dilation, slope, residual_slope)


@_conv_lrelu.register_fake
def _(a, weight, bias, mask, residual, padding, dilation, slope, residual_slope):
    return _empty_channels_fastest(a, weight.shape[0])


def conv_lrelu(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor, padding: int,
               dilation: int, slope: float, residual: torch.Tensor | None = None,
               residual_slope: float = 1.0) -> torch.Tensor:
    """mask * lrelu(conv1d(a, weight, bias, padding, dilation) [+ lrelu(residual, residual_slope)], slope);
    (B, C_in, T) -> (B, C_out, T), channels fastest (module docstring)."""
    _validate(a, weight, bias, mask, residual, padding, dilation, slope, residual_slope)
    return _conv_lrelu(a, weight, bias, mask, residual, padding, dilation, slope, residual_slope)


def cached_graphs() -> int:
    """How many cuDNN graphs this process has built (one per distinct call)."""
    return len(_graphs)
