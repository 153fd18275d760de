"""Write a Triton Inference Server model repository for one variant.

    python -m serve.triton_repo --variant original_onnx --out triton_models
    python -m serve.triton_repo --manifest outputs/champion/manifest.json --out triton_models \
        --max-batch-size 16 --preferred-batch-sizes 4,8,16 --max-queue-delay-us 2000 \
        --instance-kind gpu --instances 1

Writes two model entries:

* ``tts_<variant>/``: the ONNX Runtime backend, ``config.pbtxt`` plus ``1/model.onnx``, the
  variant's prepared graph made batchable (``models.piper.triton_graph``: ``scales`` is per request).
* ``tts_<variant>_trt/``: the TensorRT slot, ``config.pbtxt`` (platform ``tensorrt_plan``) and an
  empty ``1/``. ``1/model.plan`` is built from ``tts_<variant>/1/model.onnx`` by
  ``python -m export.tensorrt_engine`` on a machine with TensorRT; until then start Triton with
  ``--model-control-mode=explicit --load-model=tts_<variant>`` so the empty slot is not loaded.

The graph takes phoneme ids, not text: the client runs the voice's frontend
(the family reference runtime's ``text_to_utterances``) and draws the noise. Triton's dynamic batcher joins
only requests whose tensors have the same shape, so clients pad ``input`` (with its true
``input_lengths``) to a length bucket and send noise sized for that bucket; padding does not
change a row's audio (the graph masks by ``input_lengths``).
"""
from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path

import onnx

from core.atomic_io import write_text_atomic
from export.manifest import load_manifest
from models.piper.onnx_runtime import _latent_channels
from models.piper.triton_graph import SCALE_NAMES, triton_graph
from models.registry import get_family

VARIANTS = ("original_onnx",)  # what --variant builds without a manifest
INSTANCE_KINDS = {"gpu": "KIND_GPU", "cpu": "KIND_CPU"}


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
    """A servable variant: its name, its voice (frontend, config) and its prepared graph."""

    name: str
    voice: str
    graph: onnx.ModelProto


def load_variant_graph(manifest_path: Path | None = None, variant: str | None = None,
                       voice: str = "", family: str = "piper") -> VariantGraph:
    """The champion named by ``manifest_path``, or ``variant`` (one of VARIANTS) built from ``family``'s
    ``voice`` ("" for the family's default voice) by its reference runtime."""
    if (manifest_path is None) == (variant is None):
        raise ValueError("give exactly one of --manifest PATH or --variant NAME")
    if manifest_path is not None:
        manifest = load_manifest(Path(manifest_path))
        return VariantGraph(manifest.variant, manifest.voice, onnx.load(str(manifest.graph_path(manifest_path))))
    if variant not in VARIANTS:
        raise ValueError(f"--variant {variant!r}: use one of {list(VARIANTS)}, or --manifest for a champion")
    runtime = get_family(family).reference
    if runtime is None:
        raise ValueError(f"family {family} ships no graph of its own to serve with Triton")
    voice = voice or get_family(family).default_voice
    return VariantGraph(variant, voice, runtime.prepare_graph(runtime.graph_path(voice)))


def _tensor(name: str, data_type: str, dims: list[int], batch_only: bool = False) -> dict:
    """One config input/output. A tensor that is only (B,) is declared [1] and reshaped to []."""
    entry = {"name": name, "data_type": data_type, "dims": [1] if batch_only else dims}
    if batch_only:
        entry["reshape"] = {"shape": []}
    return entry


def model_config(name: str, platform: str, graph: onnx.ModelProto, batching: BatchingSettings) -> dict:
    """The config of one model entry as plain data; dims exclude the batch dimension."""
    graph_inputs = {graph_input.name for graph_input in graph.graph.input}
    latent_channels = _latent_channels(graph)
    inputs = [
        _tensor("input", "TYPE_INT64", [-1]),  # (B, T_text) phoneme ids, right-padded
        _tensor("input_lengths", "TYPE_INT64", [], batch_only=True),  # (B,)
        _tensor("scales", "TYPE_FP32", [len(SCALE_NAMES)]),  # (B, 3): noise_scale, length_scale, noise_scale_w
        _tensor("duration_noise", "TYPE_FP32", [2, -1]),  # (B, 2, >= T_text)
        _tensor("prior_noise", "TYPE_FP32", [latent_channels, -1]),  # (B, C_latent, >= T_frames)
    ]
    if "sid" in graph_inputs:
        inputs.append(_tensor("sid", "TYPE_INT64", [], batch_only=True))  # (B,) speaker ids
    return {
        "name": name,
        **({"backend": "onnxruntime"} if platform == "onnxruntime_onnx" else {"platform": platform}),
        "max_batch_size": batching.max_batch_size,
        "input": inputs,
        "output": [
            _tensor("output", "TYPE_FP32", [1, 1, -1]),  # (B, 1, 1, T_audio), right-padded
            _tensor("durations", "TYPE_FP32", [1, -1]),  # (B, 1, T_text) frames per phoneme id
        ],
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


def _plan_slot_comment(onnx_model: str, trt_model: str) -> str:
    return (
        f"# TensorRT slot for {onnx_model}: same inputs and outputs, engine in 1/model.plan.\n"
        f"# Build it where TensorRT is installed, from this repository's {onnx_model}/1/model.onnx:\n"
        f"#   python -m export.tensorrt_engine --onnx {onnx_model}/1/model.onnx --out {trt_model}/1/model.plan\n"
        f"# Until the plan exists, start Triton with --model-control-mode=explicit --load-model={onnx_model}.\n"
    )


def write_repository(variant: VariantGraph, out_dir: Path, batching: BatchingSettings) -> dict[str, Path]:
    """Write both entries under ``out_dir``; returns {model name: its config.pbtxt}."""
    out_dir = Path(out_dir)
    onnx_name, trt_name = f"tts_{variant.name}", f"tts_{variant.name}_trt"
    graph = triton_graph(variant.graph)
    written = {}
    for name, platform in ((onnx_name, "onnxruntime_onnx"), (trt_name, "tensorrt_plan")):
        model_dir = out_dir / name
        if model_dir.exists():
            shutil.rmtree(model_dir)  # a stale version folder would be served beside the new one
        (model_dir / "1").mkdir(parents=True)
        header = f"# Triton model config for variant {variant.name} (voice {variant.voice}); " \
                 "written by `python -m serve.triton_repo`.\n"
        if platform == "tensorrt_plan":
            header += _plan_slot_comment(onnx_name, trt_name)
        config_path = model_dir / "config.pbtxt"
        write_text_atomic(config_path, header + to_pbtxt(model_config(name, platform, graph, batching)) + "\n")
        written[name] = config_path
    onnx.save(graph, str(out_dir / onnx_name / "1" / "model.onnx"))
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", type=Path, help="a champion's manifest.json (export/manifest.py)")
    source.add_argument("--variant", help=f"one of {list(VARIANTS)}")
    parser.add_argument("--voice", default="", help="the voice of --variant; default: the family's own")
    parser.add_argument("--out", type=Path, required=True, help="the model repository folder")
    parser.add_argument("--max-batch-size", type=int, default=BatchingSettings.max_batch_size)
    parser.add_argument("--preferred-batch-sizes", default=",".join(map(str, BatchingSettings.preferred_batch_sizes)))
    parser.add_argument("--max-queue-delay-us", type=int, default=BatchingSettings.max_queue_delay_us)
    parser.add_argument("--instance-kind", default=BatchingSettings.instance_kind, choices=sorted(INSTANCE_KINDS))
    parser.add_argument("--instances", type=int, default=BatchingSettings.instances)
    args = parser.parse_args(argv)
    try:
        preferred = tuple(int(size) for size in args.preferred_batch_sizes.split(","))
    except ValueError:
        parser.error(f"--preferred-batch-sizes {args.preferred_batch_sizes!r}: "
                     "give integers joined by commas, e.g. 4,8,16")
    batching = BatchingSettings(args.max_batch_size, preferred, args.max_queue_delay_us,
                                args.instance_kind, args.instances)
    variant = load_variant_graph(args.manifest, args.variant, args.voice)
    for name, config_path in write_repository(variant, args.out, batching).items():
        print(f"{name}: {config_path}")


if __name__ == "__main__":
    main()
