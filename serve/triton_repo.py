"""Write a Triton Inference Server model repository for one variant.

    python -m serve.triton_repo --variant original_onnx --family <family> --out triton_models
    python -m serve.triton_repo --manifest outputs/champion/piper/manifest.json --out triton_models \
        --max-batch-size 16 --preferred-batch-sizes 4,8,16 --max-queue-delay-us 2000 \
        --instance-kind gpu --instances 1

Writes two model entries:

* ``tts_<variant>/``: the ONNX Runtime backend, ``config.pbtxt`` plus ``1/model.onnx``, the
  variant's prepared graph made batchable by its family (``Family.triton``: every input gets a
  batch dimension first, so per-request settings stay per request).
* ``tts_<variant>_trt/``: the TensorRT entry, ``config.pbtxt`` (platform ``tensorrt_plan``) and
  ``1/model.plan``, built here from ``tts_<variant>/1/model.onnx`` by whichever TensorRT is
  installed (export/tensorrt_engine.py: TensorRT-RTX builds without a GPU), with a profile whose
  batch reaches ``max_batch_size``. The config's header says which builder made the plan, or the
  parser's/builder's error when it could not; then ``1/`` holds no plan and Triton is started with
  ``--model-control-mode=explicit --load-model=tts_<variant>`` so the empty slot is not loaded.
  A TensorRT-RTX plan runs on compute capability 8.0, 8.6, 8.9 and 12.x GPUs only.

The graph takes phoneme ids, not text: the client runs the voice's frontend
(the family reference runtime's ``text_to_utterances``) and builds the other inputs the family
states (``TritonLayout.inputs``: noise, for a family that samples it). Triton's dynamic batcher
joins only requests whose tensors have the same shape, so clients pad the phoneme ids (with their
true lengths) to a length bucket and size the other inputs for that bucket; padding does not
change a row's audio (the graph masks by the lengths).
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import onnx

from core.atomic_io import write_text_atomic
from export.manifest import load_manifest
from export.settings import TensorRTSettings
from export.tensorrt_engine import EngineBuildResult, build_engine
from models.family import Family, ServedTensor, TritonLayout
from models.registry import FAMILIES, get_family

VARIANTS = ("original_onnx",)  # what --variant builds without a manifest
INSTANCE_KINDS = {"gpu": "KIND_GPU", "cpu": "KIND_CPU"}
DATA_TYPES = {"int64": "TYPE_INT64", "float32": "TYPE_FP32"}  # numpy dtype name -> Triton's


@dataclass(frozen=True)
class BatchingSettings:
    max_batch_size: int = 16  # the largest batch one instance runs; the H200 plateaus past ~16 (docs/benchmarks.md)
    preferred_batch_sizes: tuple[int, ...] = (4, 8, 16)
    max_queue_delay_us: int = 2000  # 2 ms: small beside a ~10 ms batch, enough to gather a few requests
    instance_kind: str = "gpu"
    instances: int = 1

    def __post_init__(self):
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size={self.max_batch_size}: must be >= 1 (Triton batching needs > 0)")
        bad = [size for size in self.preferred_batch_sizes if not 1 <= size <= self.max_batch_size]
        if not self.preferred_batch_sizes or bad:
            raise ValueError(f"preferred_batch_sizes={list(self.preferred_batch_sizes)}: give sizes in "
                             f"1..max_batch_size ({self.max_batch_size})")
        if self.max_queue_delay_us < 0:
            raise ValueError(f"max_queue_delay_us={self.max_queue_delay_us}: must be >= 0")
        if self.instance_kind not in INSTANCE_KINDS:
            raise ValueError(f"instance_kind={self.instance_kind!r}: use one of {sorted(INSTANCE_KINDS)}")
        if self.instances < 1:
            raise ValueError(f"instances={self.instances}: must be >= 1")


@dataclass(frozen=True)
class VariantGraph:
    """A servable variant: its name, its family, its voice (frontend, config) and its prepared graph."""

    name: str
    family: str
    voice: str
    graph: onnx.ModelProto


def load_variant_graph(manifest_path: Path | None = None, variant: str | None = None,
                       voice: str = "", family: str | None = None) -> VariantGraph:
    """The champion named by ``manifest_path`` (which names its family), or ``variant`` (one of
    VARIANTS) built from ``family``'s ``voice`` ("" for the family's default voice) by its reference
    runtime."""
    if (manifest_path is None) == (variant is None):
        raise ValueError("give exactly one of --manifest PATH or --variant NAME")
    if manifest_path is not None:
        manifest = load_manifest(Path(manifest_path))
        return VariantGraph(manifest.variant, manifest.family, manifest.voice,
                            onnx.load(str(manifest.graph_path(manifest_path))))
    if variant not in VARIANTS:
        raise ValueError(f"--variant {variant!r}: use one of {list(VARIANTS)}, or --manifest for a champion")
    if family is None:
        raise ValueError(f"--variant {variant!r} needs --family: one of {sorted(FAMILIES)}")
    runtime = get_family(family).reference
    if runtime is None:
        raise ValueError(f"family {family} ships no graph of its own to serve with Triton")
    voice = voice or get_family(family).default_voice
    return VariantGraph(variant, family, voice, runtime.prepare_graph(runtime.graph_path(voice)))


def triton_layout(family: Family) -> TritonLayout:
    """``family.triton``; a ValueError naming the family when it has none."""
    if family.triton is None:
        raise ValueError(f"family {family.name!r} registers no Triton layout (Family.triton: how its graph "
                         "is batched per request and which tensors it serves); its graphs cannot be served "
                         f"with Triton. Families with one: {sorted(f.name for f in FAMILIES.values() if f.triton)}")
    return family.triton


def _tensor(tensor: ServedTensor) -> dict:
    """One config input/output. A tensor that is only (B,) is declared [1] and reshaped to []."""
    if tensor.dtype not in DATA_TYPES:
        raise ValueError(f"served tensor {tensor.name!r} has dtype {tensor.dtype!r}; Triton configs here "
                         f"take {sorted(DATA_TYPES)}")
    entry = {"name": tensor.name, "data_type": DATA_TYPES[tensor.dtype],
             "dims": [1] if tensor.batch_only else list(tensor.dims)}
    if tensor.batch_only:
        entry["reshape"] = {"shape": []}
    return entry


def model_config(name: str, platform: str, graph: onnx.ModelProto, batching: BatchingSettings,
                 layout: TritonLayout) -> dict:
    """The config of one model entry as plain data; dims exclude the batch dimension. ``layout``
    (the family's) states the graph's served inputs and outputs."""
    return {
        "name": name,
        **({"backend": "onnxruntime"} if platform == "onnxruntime_onnx" else {"platform": platform}),
        "max_batch_size": batching.max_batch_size,
        "input": [_tensor(tensor) for tensor in layout.inputs(graph)],
        "output": [_tensor(tensor) for tensor in layout.outputs(graph)],
        "dynamic_batching": {
            "preferred_batch_size": list(batching.preferred_batch_sizes),
            "max_queue_delay_microseconds": batching.max_queue_delay_us,
        },
        "instance_group": [{"count": batching.instances, "kind": INSTANCE_KINDS[batching.instance_kind]}],
    }


def to_pbtxt(message: dict, indent: int = 0) -> str:
    """Protobuf text format of a config held as plain data (dicts, lists, str, int, enum names)."""
    pad = "  " * indent
    lines = []
    for key, value in message.items():
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and value and not isinstance(value[0], dict):
            lines.append(f"{pad}{key}: [{', '.join(_scalar(item) for item in value)}]")
            continue
        if isinstance(value, list) and not value:
            lines.append(f"{pad}{key}: []")
            continue
        for item in items:
            if isinstance(item, dict):
                lines.append(f"{pad}{key} {{")
                lines.append(to_pbtxt(item, indent + 1))
                lines.append(f"{pad}}}")
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
    return "\n".join(line for line in lines if line)


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and (value.startswith("TYPE_") or value.startswith("KIND_")):
        return value  # an enum value name
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _plan_comment(onnx_model: str, trt_model: str, built: EngineBuildResult | None) -> str:
    """The TensorRT entry's header: what built its plan, or why there is none and how to build one."""
    rebuild = (f"#   python -m export.tensorrt_engine --onnx {onnx_model}/1/model.onnx "
               f"--out {trt_model}/1/model.plan\n")
    if built is not None and built.status == "built":
        counts = ", ".join(f"{precision} {count}" for precision, count in built.precision_counts.items())
        return (f"# 1/model.plan: built from {onnx_model}/1/model.onnx by {built.backend} {built.backend_version} "
                f"in {built.build_time_s:.1f} s, {built.plan_bytes / 2**20:.1f} MiB; engine layers: {counts}.\n"
                f"# Rebuild it with\n{rebuild}")
    why = "no plan was asked for" if built is None else f"{built.status}: {built.reason}"
    why = " ".join(why.split())  # the builder's message on one comment line
    return (f"# TensorRT slot for {onnx_model}: same inputs and outputs, engine in 1/model.plan; not built ({why}).\n"
            f"# Build it where TensorRT is installed and accepts the graph:\n{rebuild}"
            f"# Until the plan exists, start Triton with --model-control-mode=explicit --load-model={onnx_model}.\n")


def plan_settings(tensorrt: TensorRTSettings, batching: BatchingSettings) -> TensorRTSettings:
    """``tensorrt`` with a batch range Triton can fill: 1 .. max_batch_size, optimized for the largest
    preferred batch."""
    batch = [1, max(batching.preferred_batch_sizes), batching.max_batch_size]
    return dataclasses.replace(tensorrt, axis_ranges={**tensorrt.axis_ranges, "batch_size": batch})


def write_repository(variant: VariantGraph, out_dir: Path, batching: BatchingSettings,
                     tensorrt: TensorRTSettings | None = TensorRTSettings()) -> dict[str, Path]:
    """Write both entries under ``out_dir``; returns {model name: its config.pbtxt}. ``tensorrt``:
    the plan's build settings (the batch range comes from ``batching``); None leaves the slot empty."""
    out_dir = Path(out_dir)
    onnx_name, trt_name = f"tts_{variant.name}", f"tts_{variant.name}_trt"
    layout = triton_layout(get_family(variant.family))
    graph = layout.batchable_graph(variant.graph)
    for name in (onnx_name, trt_name):
        model_dir = out_dir / name
        if model_dir.exists():
            shutil.rmtree(model_dir)  # a stale version folder would be served beside the new one
        (model_dir / "1").mkdir(parents=True)
    onnx_path = out_dir / onnx_name / "1" / "model.onnx"
    onnx.save(graph, str(onnx_path))
    built = None
    if tensorrt is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TensorRT-RTX flags calls it ignores
            built = build_engine(onnx_path, out_dir / trt_name / "1" / "model.plan", plan_settings(tensorrt, batching))
    written = {}
    for name, platform in ((onnx_name, "onnxruntime_onnx"), (trt_name, "tensorrt_plan")):
        header = f"# Triton model config for variant {variant.name} (family {variant.family}, voice " \
                 f"{variant.voice}); written by `python -m serve.triton_repo`.\n"
        if platform == "tensorrt_plan":
            header += _plan_comment(onnx_name, trt_name, built)
        config_path = out_dir / name / "config.pbtxt"
        write_text_atomic(config_path, header + to_pbtxt(model_config(name, platform, graph, batching, layout)) + "\n")
        written[name] = config_path
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", type=Path, help="a champion's manifest.json (export/manifest.py)")
    source.add_argument("--variant", help=f"one of {list(VARIANTS)}")
    parser.add_argument("--family", choices=sorted(FAMILIES), help="the family of --variant (a manifest names its own)")
    parser.add_argument("--voice", default="", help="the voice of --variant; default: the family's own")
    parser.add_argument("--out", type=Path, required=True, help="the model repository folder")
    parser.add_argument("--max-batch-size", type=int, default=BatchingSettings.max_batch_size)
    parser.add_argument("--preferred-batch-sizes", default=",".join(map(str, BatchingSettings.preferred_batch_sizes)))
    parser.add_argument("--max-queue-delay-us", type=int, default=BatchingSettings.max_queue_delay_us)
    parser.add_argument("--instance-kind", default=BatchingSettings.instance_kind, choices=sorted(INSTANCE_KINDS))
    parser.add_argument("--instances", type=int, default=BatchingSettings.instances)
    parser.add_argument("--no-plan", action="store_true", help="leave the TensorRT slot's model.plan unbuilt")
    args = parser.parse_args(argv)
    try:
        preferred = tuple(int(size) for size in args.preferred_batch_sizes.split(","))
    except ValueError:
        parser.error(f"--preferred-batch-sizes {args.preferred_batch_sizes!r}: "
                     "give integers joined by commas, e.g. 4,8,16")
    batching = BatchingSettings(args.max_batch_size, preferred, args.max_queue_delay_us,
                                args.instance_kind, args.instances)
    if args.variant is not None and args.family is None:
        parser.error(f"--variant {args.variant} needs --family: one of {sorted(FAMILIES)}")
    variant = load_variant_graph(args.manifest, args.variant, args.voice, args.family)
    for name, config_path in write_repository(variant, args.out, batching,
                                              None if args.no_plan else TensorRTSettings()).items():
        print(f"{name}: {config_path}")


if __name__ == "__main__":
    main()
