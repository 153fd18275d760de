"""Build (and, on a GPU the engine supports, run) a TensorRT engine from an exported graph.

    python -m export.tensorrt_engine --onnx outputs/export/teacher.onnx --out outputs/export/teacher.plan
    python -m export.tensorrt_engine --onnx G.onnx --out G.plan --run   # also load it on this machine's GPU

    from export.tensorrt_engine import TensorRTSettings, build_engine
    result = build_engine("teacher.onnx", "teacher.plan", TensorRTSettings())
    result.status, result.backend, result.build_time_s, result.plan_bytes, result.precision_counts

The builder is whichever TensorRT is importable: full TensorRT (``tensorrt``, datacenter GPUs) when
present, else TensorRT for RTX (``tensorrt_rtx``, the ``tensorrt`` extra: its ONNX parser and builder
run without a GPU). Every result names the backend and its version.

The network is strongly typed (NetworkDefinitionCreationFlag.STRONGLY_TYPED): every tensor keeps
the type the graph gives it, so an fp16 graph builds fp16 layers and a Q/DQ graph builds INT8 from
its explicit scales (no calibrator, no precision flags; TensorRT-RTX has none). One optimization
profile covers the graph's dynamic axes, by dim name, from ``axis_ranges`` (min/opt/max).

What a result holds: status "built", or "failed" with the parser's or builder's own error
messages verbatim, or "unavailable" when no TensorRT imports; the build time; the plan size; the
engine's layers with their precision, read from the builder's detailed verbose log (the engine
inspector needs to deserialize the plan, which needs a GPU the engine supports).

Caches, every one written atomically:
* the plan itself: beside ``<name>.plan`` goes ``<name>.plan.build.json`` keyed by the graph's
  bytes, the settings and the backend version; an identical rebuild reuses the plan
  (``reused=True``) instead of building again (the pipeline's resumed runs, the graph step after
  the exporter);
* the timing cache (``timing_cache``): loaded and saved by full TensorRT. TensorRT-RTX times no
  kernels at build time (its timing cache calls are no-ops), so with it nothing is written and the
  result says so;
* the runtime cache (TensorRT-RTX): the kernels it compiles for the GPU at run time;
  ``TensorRTRunner(plan, runtime_cache=path)`` loads it and ``save_runtime_cache()`` stores it.

Running needs a GPU the engine supports. TensorRT-RTX engines run on compute capability 8.0, 8.6,
8.9 and 12.x (Ampere, Ada, Blackwell); an H200 (9.0) refuses them, so ``--run`` there answers one
line naming the limit and exits 3.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from core.atomic_io import atomic_write, write_text_atomic
from core.config import ConfigError
from export.settings import TensorRTSettings

EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_CANNOT_RUN = 1, 2, 3
BACKENDS = ("tensorrt", "tensorrt_rtx")  # tried in this order
# Compute capabilities TensorRT-RTX 1.7 engines run on, as its runtime states when it refuses one
# ("Supported compute capabilities: 8.0 8.6 8.9 12.0 12.1 >12.0").
RTX_COMPUTE_CAPABILITIES = ((8, 0), (8, 6), (8, 9))
RTX_MIN_BLACKWELL = (12, 0)
RTX_COMPUTE_CAPABILITY_TEXT = "8.0, 8.6, 8.9 and 12.x (Ampere, Ada, Blackwell)"
# The builder log's tensor type names -> the project's precision names.
PRECISIONS = {"Float": "fp32", "Half": "fp16", "BFloat16": "bf16", "Int8": "int8", "FP8": "fp8", "Int4": "int4",
              "FP4": "fp4", "Int32": "int32", "Int64": "int64", "Bool": "bool", "UInt8": "uint8"}
RESULT_SUFFIX = ".build.json"  # beside the plan: the result and the key an identical rebuild reuses
LOG_SUFFIX = ".build.log"  # beside the plan: the builder's verbose log


@dataclass(frozen=True)
class TensorRTBackend:
    name: str  # "tensorrt" | "tensorrt_rtx"
    version: str
    module: object = field(repr=False)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


@dataclass
class EngineBuildResult:
    status: str  # "built" | "unavailable" | "failed"
    engine_path: Path | None = None
    reason: str | None = None  # why not built: the parser's / builder's messages verbatim
    profile: dict | None = None  # input name -> {"min", "opt", "max"} shapes
    backend: str | None = None  # "tensorrt" | "tensorrt_rtx"
    backend_version: str | None = None
    build_time_s: float | None = None  # parse + build, this machine
    plan_bytes: int | None = None
    layers: list[dict] = field(default_factory=list)  # [{"name", "type", "precision"}], engine order
    precision_counts: dict[str, int] = field(default_factory=dict)  # precision -> engine layers
    timing_cache: str | None = None  # what happened to engine.tensorrt.timing_cache
    reused: bool = False  # an identical earlier build's plan was reused (see the module docstring)

    def to_dict(self) -> dict:
        return {key: str(value) if isinstance(value, Path) else value for key, value in dataclasses.asdict(self).items()}


def profile_shapes(model: onnx.ModelProto, axis_ranges: dict) -> dict[str, dict[str, list[int]]]:
    """{input: {"min": shape, "opt": shape, "max": shape}} for every input with a dynamic axis.

    A dynamic axis whose name has no range is a ConfigError naming it. Ranges for names this graph
    lacks are ignored: one config serves the full synthesizer and a decoder-only graph.
    """
    shapes = {}
    for graph_input in model.graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        if all(dim.dim_value > 0 for dim in dims):
            continue  # static: no profile entry needed
        per_level = {"min": [], "opt": [], "max": []}
        for axis, dim in enumerate(dims):
            if dim.dim_value > 0:
                for shape in per_level.values():
                    shape.append(dim.dim_value)
                continue
            if not dim.dim_param or dim.dim_param not in axis_ranges:
                raise ConfigError(f"input {graph_input.name!r} axis {axis} ({dim.dim_param or 'unnamed'}) is dynamic "
                                  f"but engine.tensorrt.axis_ranges has no range for it; named: {sorted(axis_ranges)}")
            for level, value in zip(("min", "opt", "max"), axis_ranges[dim.dim_param]):
                per_level[level].append(int(value))
        shapes[graph_input.name] = per_level
    return shapes


def import_backend() -> tuple[TensorRTBackend | None, str | None]:
    """The first importable of BACKENDS, or None with why none imports."""
    failures = []
    for name in BACKENDS:
        try:
            module = __import__(name)
        except ImportError as error:
            failures.append(f"{name}: {error}")
            continue
        return TensorRTBackend(name, module.__version__, module), None
    return None, ("no TensorRT is installed here (" + "; ".join(failures) +
                  "); install the builder with `pip install -e .[tensorrt]`")


def _collecting_logger(trt):
    """A trt.ILogger keeping every (severity, message) at VERBOSE, for the layer list and the errors."""

    class CollectingLogger(trt.ILogger):
        def __init__(self):
            super().__init__()
            self.records: list[tuple[object, str]] = []

        def log(self, severity, msg):
            self.records.append((severity, msg))

        def errors(self, context: int = 0) -> list[str]:
            """The error messages, after the ``context`` messages logged just before the first one (the
            builder states a failure's cause there: "Exceeded mem budget of N. Need M")."""
            failing = (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR)
            positions = [i for i, (severity, _) in enumerate(self.records) if severity in failing]
            if not positions:
                return []
            before = [message.strip() for _, message in self.records[max(0, positions[0] - context):positions[0]]]
            return before + [self.records[i][1].strip() for i in positions]

        def text(self) -> str:
            return "\n".join(f"[{severity.name}] {message}" for severity, message in self.records)

    return CollectingLogger()


_RTX_LAYER = re.compile(r"^Name: (?P<name>.*?), LayerType: (?P<type>[^,]*), Inputs: \[(?P<inputs>.*?)\], "
                        r"Constants: \[(?P<constants>.*?)\], Outputs: \[(?P<outputs>.*?)\], TacticName:")
_FULL_LAYER = re.compile(r"^Layer\((?P<type>[^)]*)\): (?P<name>.*?), Tactic: \S+, (?P<inputs>.*?) -> (?P<outputs>.*)$")
_DATATYPE = re.compile(r"Datatype: (\w+)")
_FULL_DATATYPE = re.compile(r"\((\w+)\[")


def _precision(*type_groups: list[str]) -> str:
    """The first tensor type of the first non-empty group (inputs, then weights, then outputs)."""
    for types in type_groups:
        if types:
            return PRECISIONS.get(types[0], types[0].lower())
    return "none"  # a layer without tensors (TensorRT-RTX's shape_call)


def layers_from_log(messages: list[str]) -> list[dict]:
    """[{"name", "type", "precision"}] from the builder's detailed verbose log.

    TensorRT-RTX prints "Layers:" then one "Name: ..., LayerType: ..., Inputs: [{... Datatype: Half
    ...}], Constants: [...], Outputs: [...]" line per engine layer; full TensorRT 10 prints "Engine
    Layer Information:" then "Layer(Type): name, Tactic: 0x..., in (Half[...]) -> out (Half[...])".
    A layer's precision is its first input's type (the type it computes in), else its first
    weight's, else its first output's.
    """
    layers = []
    for message in messages:
        if message.startswith("Layers:"):
            for line in message.splitlines()[1:]:
                match = _RTX_LAYER.match(line)
                if match:
                    layers.append({"name": match["name"], "type": match["type"], "precision": _precision(
                        _DATATYPE.findall(match["inputs"]), _DATATYPE.findall(match["constants"]),
                        _DATATYPE.findall(match["outputs"]))})
        elif message.startswith("Engine Layer Information:"):
            for line in message.splitlines()[1:]:
                match = _FULL_LAYER.match(line.strip())
                if match:
                    layers.append({"name": match["name"], "type": match["type"], "precision": _precision(
                        _FULL_DATATYPE.findall(match["inputs"]), _FULL_DATATYPE.findall(match["outputs"]))})
    return layers


def precision_counts(layers: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for layer in layers:
        counts[layer["precision"]] = counts.get(layer["precision"], 0) + 1
    return dict(sorted(counts.items()))


def _build_key(onnx_path: Path, settings: TensorRTSettings, profile: dict, backend: TensorRTBackend) -> str:
    """What makes two builds identical: the graph's bytes, the settings that reach the builder, the backend."""
    digest = hashlib.sha256(onnx_path.read_bytes())
    digest.update(json.dumps({"workspace_mib": settings.workspace_mib, "profile": profile,
                              "builder_optimization_level": settings.builder_optimization_level,
                              "backend": backend.label}, sort_keys=True).encode())
    return digest.hexdigest()


def _reused(engine_path: Path, key: str) -> EngineBuildResult | None:
    """The stored result of an identical earlier build whose plan is still there, else None."""
    record_path = engine_path.with_name(engine_path.name + RESULT_SUFFIX)
    if not (engine_path.is_file() and record_path.is_file()):
        return None
    record = json.loads(record_path.read_text(encoding="utf-8"))
    if record.get("key") != key or record["result"].get("plan_bytes") != engine_path.stat().st_size:
        return None
    result = EngineBuildResult(**{**record["result"], "engine_path": engine_path})
    result.reused = True
    return result


def _timing_cache(trt, backend: TensorRTBackend, config, cache_path: Path | None) -> str:
    """Attach ``cache_path``'s timing cache to ``config`` (full TensorRT); what happened, in words."""
    if cache_path is None:
        return "none configured"
    if backend.name == "tensorrt_rtx":
        return "not used: TensorRT-RTX times no kernels when building (its timing cache calls are no-ops)"
    cache_bytes = cache_path.read_bytes() if cache_path.is_file() else b""
    config.set_timing_cache(config.create_timing_cache(cache_bytes), ignore_mismatch=False)
    return f"loaded {len(cache_bytes)} bytes" if cache_bytes else "created"


def build_engine(onnx_path: str | Path, engine_path: str | Path, settings: TensorRTSettings,
                 backend: TensorRTBackend | None = None) -> EngineBuildResult:
    """Parse ``onnx_path`` into a strongly typed network and build a serialized engine at ``engine_path``.

    ``backend``: default, the first importable (``import_backend``).
    """
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    model = onnx.load(str(onnx_path), load_external_data=False)
    try:
        profile, profile_error = profile_shapes(model, settings.axis_ranges), None
    except ConfigError as error:  # raised once the parser has had its say: its refusal comes first
        profile, profile_error = None, error
    if backend is None:
        backend, reason = import_backend()
        if backend is None:
            if profile_error is not None:
                raise profile_error
            return EngineBuildResult("unavailable", reason=reason, profile=profile)
    if profile_error is None:
        key = _build_key(onnx_path, settings, profile, backend)
        reused = _reused(engine_path, key)
        if reused is not None:
            return reused
    trt = backend.module
    result = EngineBuildResult("failed", profile=profile, backend=backend.name, backend_version=backend.version)
    logger = _collecting_logger(trt)
    started = time.perf_counter()
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        result.reason = "ONNX parser: " + " | ".join(errors)
        result.build_time_s = time.perf_counter() - started
        return result
    if profile_error is not None:
        raise profile_error

    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # the layer list with tensor types, in the log
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_mib << 20)
    config.builder_optimization_level = settings.builder_optimization_level
    optimization_profile = builder.create_optimization_profile()
    for name, shapes in profile.items():
        optimization_profile.set_shape(name, shapes["min"], shapes["opt"], shapes["max"])
    config.add_optimization_profile(optimization_profile)
    cache_path = Path(settings.timing_cache) if settings.timing_cache else None
    result.timing_cache = _timing_cache(trt, backend, config, cache_path)

    serialized = builder.build_serialized_network(network, config)
    result.build_time_s = time.perf_counter() - started
    log_path = engine_path.with_name(engine_path.name + LOG_SUFFIX)
    write_text_atomic(log_path, logger.text())
    if serialized is None:
        errors = logger.errors(context=3) or [f"build_serialized_network returned None; the builder's log: {log_path}"]
        result.reason = "builder: " + " | ".join(errors)
        return result
    if cache_path is not None and backend.name == "tensorrt":
        timing_cache = config.get_timing_cache().serialize()
        atomic_write(cache_path, lambda tmp: Path(tmp).write_bytes(memoryview(timing_cache)))
        result.timing_cache += f"; saved {cache_path}"
    atomic_write(engine_path, lambda tmp: Path(tmp).write_bytes(memoryview(serialized)))
    result.status, result.engine_path, result.plan_bytes = "built", engine_path, engine_path.stat().st_size
    result.layers = layers_from_log([message for _, message in logger.records])
    result.precision_counts = precision_counts(result.layers)
    write_text_atomic(engine_path.with_name(engine_path.name + RESULT_SUFFIX),
                      json.dumps({"key": key, "result": result.to_dict()}, indent=1))
    return result


def runtime_support(backend: TensorRTBackend) -> str | None:
    """Why engines of ``backend`` cannot run on this machine (one line), or None when they can."""
    import torch  # noqa: PLC0415 (the runner's CUDA memory and stream come from torch)

    if not torch.cuda.is_available():
        if backend.name == "tensorrt_rtx":
            return (f"cannot run {backend.label} engines here: no CUDA GPU; they run on compute capability "
                    f"{RTX_COMPUTE_CAPABILITY_TEXT}")
        return f"cannot run {backend.label} engines here: no CUDA GPU"
    capability = torch.cuda.get_device_capability()
    if backend.name == "tensorrt_rtx" and capability not in RTX_COMPUTE_CAPABILITIES \
            and capability < RTX_MIN_BLACKWELL:
        return (f"cannot run {backend.label} engines on {torch.cuda.get_device_name()}: compute capability "
                f"{capability[0]}.{capability[1]}; TensorRT-RTX engines run on {RTX_COMPUTE_CAPABILITY_TEXT}. "
                "Build here; time on such a GPU, or with full TensorRT")
    return None


class TensorRTRunner:
    """Runs a serialized engine on CUDA tensors (torch); output shapes may depend on the data (the audio does).

        runner = TensorRTRunner("teacher.plan", runtime_cache="teacher.runtime_cache")
        outputs = runner.run({"input": ids.cuda(), ...})   # {"output": tensor, "durations": tensor}
        runner.save_runtime_cache()                         # TensorRT-RTX's JIT-compiled kernels, atomically
    """

    def __init__(self, engine_path: str | Path, runtime_cache: str | Path | None = None,
                 backend: TensorRTBackend | None = None):
        if backend is None:
            backend, reason = import_backend()
            if backend is None:
                raise RuntimeError(f"cannot run {engine_path}: {reason}")
        reason = runtime_support(backend)
        if reason is not None:
            raise RuntimeError(reason)
        import torch  # noqa: PLC0415 (the runner's CUDA memory and stream come from torch)

        trt = backend.module
        self.backend, self._trt, self._torch = backend, trt, torch
        self._logger = _collecting_logger(trt)
        self.engine = trt.Runtime(self._logger).deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise RuntimeError(f"{backend.label} could not load {engine_path}: " + " | ".join(self._logger.errors()))
        self.runtime_cache_path = Path(runtime_cache) if runtime_cache is not None else None
        self._runtime_cache = None
        if backend.name == "tensorrt_rtx" and self.runtime_cache_path is not None:
            runtime_config = self.engine.create_runtime_config()
            self._runtime_cache = runtime_config.create_runtime_cache()
            if self.runtime_cache_path.is_file():
                self._runtime_cache.deserialize(self.runtime_cache_path.read_bytes())
            runtime_config.set_runtime_cache(self._runtime_cache)
            self.context = self.engine.create_execution_context(runtime_config)
        else:
            self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self._allocator = _output_allocator(trt, torch)
        for name in self.output_names:
            self.context.set_output_allocator(name, self._allocator)

    def run(self, feeds: dict) -> dict:
        """``feeds``: input name -> CUDA tensor of the engine's input dtype, shapes inside the profile.
        Returns output name -> tensor."""
        missing = sorted(set(self.input_names) - set(feeds))
        if missing:
            raise ValueError(f"TensorRTRunner.run: inputs {missing} missing; the engine takes {self.input_names}")
        kept = {}  # the contiguous tensors must outlive the launch
        for name in self.input_names:
            tensor = feeds[name].contiguous()
            kept[name] = tensor
            if not self.context.set_input_shape(name, tuple(tensor.shape)):
                raise ValueError(f"input {name!r} shape {tuple(tensor.shape)} is outside the engine's profile "
                                 f"{self.engine.get_tensor_profile_shape(name, 0)}")
            self.context.set_tensor_address(name, tensor.data_ptr())
        stream = self._torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed: " + " | ".join(self._logger.errors()))
        stream.synchronize()
        return {name: self._allocator.output(name, self.engine.get_tensor_dtype(name)) for name in self.output_names}

    def save_runtime_cache(self) -> Path | None:
        """Write TensorRT-RTX's runtime cache (kernels compiled for this GPU) atomically; None without one."""
        if self._runtime_cache is None:
            return None
        cache_bytes = self._runtime_cache.serialize()
        atomic_write(self.runtime_cache_path, lambda tmp: Path(tmp).write_bytes(memoryview(cache_bytes)))
        return self.runtime_cache_path


def _output_allocator(trt, torch):
    """An IOutputAllocator backed by torch CUDA buffers, for outputs whose shape is known only after running."""
    dtypes = {trt.float32: torch.float32, trt.float16: torch.float16, trt.bfloat16: torch.bfloat16,
              trt.int32: torch.int32, trt.int64: torch.int64, trt.int8: torch.int8, trt.bool: torch.bool}

    class TorchOutputAllocator(trt.IOutputAllocator):
        def __init__(self):
            super().__init__()
            self.buffers, self.shapes = {}, {}

        def reallocate_output(self, tensor_name, memory, size, alignment):
            buffer = self.buffers.get(tensor_name)
            if buffer is None or buffer.numel() < size:
                buffer = torch.empty(max(int(size), 1), dtype=torch.uint8, device="cuda")
                self.buffers[tensor_name] = buffer
            return buffer.data_ptr()

        def notify_shape(self, tensor_name, shape):
            self.shapes[tensor_name] = tuple(shape)

        def output(self, tensor_name, trt_dtype):
            dtype = dtypes[trt_dtype]
            shape = self.shapes[tensor_name]
            count = 1
            for size in shape:
                count *= size
            return self.buffers[tensor_name].view(dtype)[:count].view(shape).clone()

    return TorchOutputAllocator()


def summary_line(result: EngineBuildResult) -> str:
    """One line: status, backend, time, size and layer precisions (or the reason)."""
    if result.status != "built":
        where = f" ({result.backend} {result.backend_version})" if result.backend else ""
        return f"engine_status={result.status}{where}: {result.reason}"
    counts = ", ".join(f"{precision} {count}" for precision, count in result.precision_counts.items())
    return (f"engine_status=built ({result.backend} {result.backend_version}): {result.engine_path} "
            f"{result.plan_bytes / 2**20:.1f} MiB in {result.build_time_s:.2f} s"
            f"{' (reused)' if result.reused else ''}; layers: {counts}")


def main(argv: list[str] | None = None) -> int:
    """``python -m export.tensorrt_engine --onnx G.onnx --out G.plan [--run]``: one line; exit 0 built,
    1 failed, 2 no TensorRT, 3 built but cannot run here."""
    parser = argparse.ArgumentParser(prog="python -m export.tensorrt_engine", description=__doc__.split("\n")[0])
    parser.add_argument("--onnx", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timing-cache", type=Path, default=None, help="full TensorRT's timing cache file")
    parser.add_argument("--workspace-mib", type=int, default=TensorRTSettings.workspace_mib)
    parser.add_argument("--run", action="store_true", help="then load the plan on this machine's GPU")
    parser.add_argument("--runtime-cache", type=Path, default=None, help="TensorRT-RTX's runtime cache file (--run)")
    args = parser.parse_args(argv)
    settings = TensorRTSettings(workspace_mib=args.workspace_mib,
                                timing_cache=str(args.timing_cache) if args.timing_cache else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TensorRT-RTX flags full TensorRT's calls it ignores
        result = build_engine(args.onnx, args.out, settings)
    print(summary_line(result))
    if result.status == "unavailable":
        return EXIT_UNAVAILABLE
    if result.status == "failed":
        return EXIT_FAILED
    if args.run:
        backend, _ = import_backend()
        reason = runtime_support(backend)
        if reason is not None:
            print(f"engine_run=unsupported: {reason}")
            return EXIT_CANNOT_RUN
        try:
            runner = TensorRTRunner(result.engine_path, args.runtime_cache, backend)
        except RuntimeError as error:
            print(f"engine_run=failed: {error}")
            return EXIT_CANNOT_RUN
        runner.save_runtime_cache()
        print(f"engine_run=ready: inputs {runner.input_names}, outputs {runner.output_names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
