"""Build and run a TensorRT 10 engine from an exported graph; where TensorRT is missing, say so and build nothing.

    python -m export.tensorrt_engine --onnx outputs/export/teacher.onnx --out outputs/export/teacher.plan

    from export.tensorrt_engine import TensorRTSettings, build_engine
    result = build_engine("teacher.onnx", "teacher.plan", TensorRTSettings())
    result.status          # "built" or "unavailable" (log it as engine_status)

The network is strongly typed (NetworkDefinitionCreationFlag.STRONGLY_TYPED): every tensor keeps
the type the graph gives it, so an fp16 graph builds fp16 and a Q/DQ graph builds INT8 from its
explicit scales (no calibrator, no precision flags). One optimization profile covers the graph's
dynamic axes, by dim name, from ``axis_ranges`` (min/opt/max). The timing cache is loaded
from and saved to ``timing_cache`` so rebuilds skip kernel timing; the serialized engine is
written atomically.

TensorRT cannot be installed on this project's machines: ``import tensorrt`` fails, the CLI
prints one line and exits 2, and ``build_engine`` returns status "unavailable" with the reason.
Settings and profiles are validated before the import, so a bad config fails everywhere.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import onnx

from core.atomic_io import atomic_write
from core.config import ConfigError
from export.settings import TensorRTSettings

EXIT_UNAVAILABLE = 2


@dataclass
class EngineBuildResult:
    status: str  # "built" | "unavailable" | "failed"
    engine_path: Path | None = None
    reason: str | None = None
    profile: dict | None = None  # input name -> {"min", "opt", "max"} shapes


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


def _import_tensorrt():
    """The tensorrt module, or None with the reason it cannot be imported."""
    try:
        import tensorrt  # noqa: PLC0415 (optional: absent on this project's machines)
    except ImportError as error:
        return None, f"TensorRT is not installed here ({error})"
    return tensorrt, None


def build_engine(onnx_path: str | Path, engine_path: str | Path, settings: TensorRTSettings) -> EngineBuildResult:
    """Parse ``onnx_path`` into a strongly typed network and build a serialized engine at ``engine_path``."""
    model = onnx.load(str(onnx_path), load_external_data=False)
    profile = profile_shapes(model, settings.axis_ranges)
    trt, reason = _import_tensorrt()
    if trt is None:
        return EngineBuildResult("unavailable", reason=reason, profile=profile)

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        return EngineBuildResult("failed", reason=f"ONNX parser: {errors}", profile=profile)

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_mib << 20)
    config.builder_optimization_level = settings.builder_optimization_level
    optimization_profile = builder.create_optimization_profile()
    for name, shapes in profile.items():
        optimization_profile.set_shape(name, shapes["min"], shapes["opt"], shapes["max"])
    config.add_optimization_profile(optimization_profile)
    cache_path = Path(settings.timing_cache) if settings.timing_cache else None
    cache_bytes = cache_path.read_bytes() if cache_path is not None and cache_path.is_file() else b""
    config.set_timing_cache(config.create_timing_cache(cache_bytes), ignore_mismatch=False)

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        return EngineBuildResult("failed", reason="build_serialized_network returned None (see the TensorRT log)",
                                 profile=profile)
    if cache_path is not None:
        timing_cache = config.get_timing_cache()
        atomic_write(cache_path, lambda tmp: Path(tmp).write_bytes(memoryview(timing_cache.serialize())))
    engine_path = Path(engine_path)
    atomic_write(engine_path, lambda tmp: Path(tmp).write_bytes(memoryview(serialized)))
    return EngineBuildResult("built", engine_path=engine_path, profile=profile)


class TensorRTRunner:
    """Runs a serialized engine on CUDA tensors (torch); output shapes may depend on the data (the audio does).

        runner = TensorRTRunner("teacher.plan")
        outputs = runner.run({"input": ids.cuda(), ...})   # {"output": tensor, "durations": tensor}
    """

    def __init__(self, engine_path: str | Path):
        trt, reason = _import_tensorrt()
        if trt is None:
            raise RuntimeError(f"cannot run {engine_path}: {reason}")
        import torch  # noqa: PLC0415 (the runner's CUDA memory and stream come from torch)

        self._trt, self._torch = trt, torch
        self._logger = trt.Logger(trt.Logger.WARNING)
        self.engine = trt.Runtime(self._logger).deserialize_cuda_engine(Path(engine_path).read_bytes())
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self._allocator = _output_allocator(trt, torch)
        for name in self.output_names:
            self.context.set_output_allocator(name, self._allocator)

    def run(self, feeds: dict) -> dict:
        """``feeds``: input name -> contiguous CUDA tensor of the engine's input dtype. Returns output name -> tensor."""
        missing = sorted(set(self.input_names) - set(feeds))
        if missing:
            raise ValueError(f"TensorRTRunner.run: inputs {missing} missing; the engine takes {self.input_names}")
        for name in self.input_names:
            tensor = feeds[name].contiguous()
            feeds[name] = tensor
            self.context.set_input_shape(name, tuple(tensor.shape))
            self.context.set_tensor_address(name, tensor.data_ptr())
        stream = self._torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")
        stream.synchronize()
        return {name: self._allocator.output(name, self.engine.get_tensor_dtype(name)) for name in self.output_names}


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


def main(argv: list[str] | None = None) -> int:
    """``python -m export.tensorrt_engine --onnx G.onnx --out G.plan``; one line when TensorRT is missing, exit 2."""
    parser = argparse.ArgumentParser(prog="python -m export.tensorrt_engine", description=__doc__.split("\n")[0])
    parser.add_argument("--onnx", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timing-cache", type=Path, default=None)
    parser.add_argument("--workspace-mib", type=int, default=4096)
    args = parser.parse_args(argv)
    settings = TensorRTSettings(workspace_mib=args.workspace_mib,
                                timing_cache=str(args.timing_cache) if args.timing_cache else None)
    result = build_engine(args.onnx, args.out, settings)
    if result.status == "unavailable":
        print(f"engine_status=unavailable: {result.reason}; no engine built for {args.onnx}")
        return EXIT_UNAVAILABLE
    if result.status == "failed":
        print(f"engine_status=failed: {result.reason}")
        return 1
    print(f"engine_status=built: {result.engine_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
