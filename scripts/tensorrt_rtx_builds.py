"""Build TensorRT engines of a family's graphs, the original beside ours, and record what the builder said.

    python scripts/tensorrt_rtx_builds.py --work outputs/tensorrt_builds \
        --qdq mlruns/1/<run>/artifacts/stage/qdq_decoder-<key>.onnx \
        --lite-weights mlruns/1/<run>/artifacts/stage/lite_joe_medium.safetensors \
        --out docs/results/cpu_7_tensorrt_rtx_builds.json
    python scripts/tensorrt_rtx_builds.py --family kokoro --work outputs/tensorrt_builds_kokoro \
        --out docs/results/cpu_9_kokoro_trt_rtx.json

Graphs: the voice's ONNX as it ships and as the pipeline deploys it (prepared); our exporter's
synthesizer in fp32 and with an fp16 decoder and flow, as one graph and as the pair split at the
durations that TensorRT builds (models/piper/rewrites/duration_split.py); our exporter's decoder
alone in fp32 and fp16; when given, modelopt's Q/DQ INT8 decoder graph from a pipeline run; and
the Lite student (a pipeline run's trained flow and decoder in the teacher) exported both ways.
Each goes through export/tensorrt_support.py ``engine_readiness`` with the default engine
settings (batch 1-16, phonemes 2-400, frames 2-6400), so the figures are the pipeline's own. One thread: the machine is shared.

``--family kokoro``: Kokoro's int8 graph as it ships and as the pipeline deploys it (prepared with its
durations output), and our synthesizer in each graph variant (models/kokoro/onnx_contract.py: "cpu",
"float32", "reference") on the jf_alpha weights, with Kokoro's text and noise axes (ids 3-512,
``tensorrt_axis_ranges``; the shipped graph's ``sequence_length`` takes the same ids range).
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import re
import warnings
from pathlib import Path

import onnx
import torch

from core.atomic_io import write_text_atomic
from core.paths import DEFAULT_CACHE_DIR
from core.revision import provenance
from export.onnx_export import export_decoder, export_graph
from export.settings import TensorRTSettings
from export.tensorrt_support import engine_readiness
from models.graph_contract import SYNTHESIZER
from models.kokoro.onnx_contract import (
    GRAPH_VARIANTS,
    synthesizer_contract,
    tensorrt_axis_ranges,
)
from models.kokoro.reference_runtime import prepare_graph as prepare_kokoro_graph
from models.kokoro.release import int8_graph_path, official_config
from models.piper.lite import load_student
from models.piper.onnx_contract import tensorrt_graph_contracts
from models.piper.onnx_runtime import prepare_graph
from models.piper.voice_files import PiperVoiceFiles
from models.precision import PrecisionIsland
from models.registry import get_family

REPO_ROOT = Path(__file__).resolve().parents[1]

HALF_PARTS = ("flow", "decoder")  # the fp16 graph: the parts the fp16 stage can keep in half precision
KOKORO_SHIPPED_AXIS = "sequence_length"  # the shipped graph's name for its ids axis
# One per node the parser refuses: an op it has no importer for, or a custom op with no plugin.
PARSER_UNSUPPORTED = re.compile(r"operator: (\w+) \(\w+\): (?:UNSUPPORTED_NODE|INVALID_NODE)")


def _casts_to_float64(graph: Path) -> int:
    nodes = onnx.load(str(graph), load_external_data=False).graph.node
    return sum(1 for node in nodes if node.op_type == "Cast"
               for attribute in node.attribute if attribute.name == "to" and attribute.i == onnx.TensorProto.DOUBLE)


def _graphs(work: Path, qdq: Path | None, lite_weights: Path | None) -> dict[str, Path]:
    """name -> ONNX path, exporting what is missing under ``work``."""
    files = PiperVoiceFiles.resolve("bundled:joe")
    graphs = {"original (as shipped)": files.onnx_path}
    prepared = work / "original_prepared.onnx"
    if not prepared.is_file():
        onnx.save(prepare_graph(files.onnx_path), str(prepared))
    graphs["original (prepared, as deployed)"] = prepared
    family = get_family("piper")
    teacher = family.load_teacher("bundled:joe", DEFAULT_CACHE_DIR)
    half = copy.deepcopy(teacher)
    for role in HALF_PARTS:
        half.replace_part(role, PrecisionIsland(half.parts()[role], torch.float16))
    latent_channels = teacher.model.hp.latent_channels
    exports = {
        "ours fp32 synthesizer": (work / "fp32.onnx", lambda p: export_graph(family.graph_contracts(teacher)[SYNTHESIZER], p)),
        "ours fp16 synthesizer (flow, decoder fp16)": (
            work / "fp16.onnx", lambda p: export_graph(family.graph_contracts(half)[SYNTHESIZER], p)),
        **{f"ours fp32 pair: {graph}": (work / f"fp32_{graph}.onnx", lambda p, c=contract: export_graph(c, p))
           for graph, contract in tensorrt_graph_contracts(teacher).items()},
        **{f"ours fp16 pair: {graph}": (work / f"fp16_{graph}.onnx", lambda p, c=contract: export_graph(c, p))
           for graph, contract in tensorrt_graph_contracts(half).items()},
        "ours fp32 decoder": (work / "decoder_fp32.onnx", lambda p: export_decoder(teacher.parts()["decoder"], p,
                                                                                    latent_channels)),
        "ours fp16 decoder": (work / "decoder_fp16.onnx", lambda p: export_decoder(half.parts()["decoder"], p,
                                                                                    latent_channels)),
    }
    for name, (path, export) in exports.items():
        graphs[name] = path if path.is_file() else export(path)
    if lite_weights is not None:
        lite = copy.deepcopy(teacher)
        for role, part in load_student(teacher.model.hp, lite_weights)[0].items():
            lite.replace_part(role, part)
        exports = {"Lite student synthesizer": (work / "lite.onnx", lambda p: export_graph(
            family.graph_contracts(lite)[SYNTHESIZER], p))}
        exports.update({f"Lite student pair: {graph}": (work / f"lite_{graph}.onnx",
                                                        lambda p, c=contract: export_graph(c, p))
                        for graph, contract in tensorrt_graph_contracts(lite).items()})
        for name, (path, export) in exports.items():
            graphs[name] = path if path.is_file() else export(path)
    if qdq is not None:
        graphs["modelopt Q/DQ INT8 decoder"] = qdq
    return graphs


def _kokoro_graphs(work: Path) -> dict[str, Path]:
    """name -> ONNX path of Kokoro's graphs (module docstring), exporting what is missing under ``work``."""
    shipped = int8_graph_path(DEFAULT_CACHE_DIR)
    graphs = {"original int8 (as shipped)": shipped}
    prepared = work / "original_prepared.onnx"
    if not prepared.is_file():
        onnx.save(prepare_kokoro_graph(shipped), str(prepared))
    graphs["original int8 (prepared, as deployed)"] = prepared
    teacher = get_family("kokoro").load_teacher("jf_alpha", DEFAULT_CACHE_DIR)
    for variant in GRAPH_VARIANTS:
        path = work / f"synthesizer_{variant}.onnx"
        graphs[f"ours {variant} synthesizer"] = (
            path if path.is_file() else export_graph(synthesizer_contract(teacher, variant), path))
    return graphs


def _kokoro_settings() -> TensorRTSettings:
    """The default engine settings with Kokoro's text and noise axes (batch 1-16 as the defaults)."""
    axes = tensorrt_axis_ranges(official_config())
    return TensorRTSettings(axis_ranges={**TensorRTSettings().axis_ranges, **axes,
                                         KOKORO_SHIPPED_AXIS: axes["phonemes"]})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=("piper", "kokoro"), default="piper", help="whose graphs to build")
    parser.add_argument("--work", type=Path, required=True, help="exported graphs and plans go here")
    parser.add_argument("--qdq", type=Path, help="a modelopt Q/DQ decoder graph from a pipeline run")
    parser.add_argument("--lite-weights", type=Path, help="a Lite student's weights from a pipeline run")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.family == "kokoro" and (args.qdq or args.lite_weights):
        parser.error("--qdq and --lite-weights are Piper pipeline artifacts; give them with --family piper")
    torch.set_num_threads(1)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.family == "kokoro":
        settings, graphs = _kokoro_settings(), _kokoro_graphs(args.work)
    else:
        settings, graphs = TensorRTSettings(), _graphs(args.work, args.qdq, args.lite_weights)
    rows = {}
    for name, graph in graphs.items():
        plan = args.work / (graph.stem + ".plan")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            report = engine_readiness(graph, plan, settings)
        engine = report["engine"]
        rows[name] = {
            "graph": str(graph), "graph_mib": graph.stat().st_size / 2**20, "ready": report["ready"],
            "verdict_source": report["verdict_source"], "status": engine["status"], "reason": engine["reason"],
            "build_time_s": engine["build_time_s"], "plan_mib": (engine["plan_bytes"] or 0) / 2**20 or None,
            "precision_counts": engine["precision_counts"], "engine_layers": len(engine["layers"]),
            "op_table_ready": report["op_table_hint"]["ready"],
            "op_table_blockers": sorted({b["op"] for b in report["op_table_hint"]["blockers"]}),
            # The parser's own refusals, by op: it names every node it cannot import, not the first only.
            "parser_unsupported_ops": dict(collections.Counter(
                PARSER_UNSUPPORTED.findall(engine["reason"] or "")).most_common()),
            # TensorRT has no float64: its parser imports such a Cast as one to float32 (its verbose log
            # says "Casting to type: float32"), so a graph with these builds but computes them in float32.
            "casts_to_float64": _casts_to_float64(graph),
        }
        print(f"{name}: {engine['status']} {engine['build_time_s'] or 0:.2f} s "
              f"{rows[name]['plan_mib'] or 0:.1f} MiB {engine['precision_counts']} {(engine['reason'] or '')[:200]}")
    sources = sorted({row["verdict_source"] for row in rows.values()})
    result = {**provenance(REPO_ROOT), "family": args.family, "torch_threads": torch.get_num_threads(), "gpu": "none",
              "verdict_sources": sources,
              "settings": {"axis_ranges": settings.axis_ranges, "workspace_mib": settings.workspace_mib,
                           "builder_optimization_level": settings.builder_optimization_level},
              "graphs": rows}
    write_text_atomic(args.out, json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
