"""Stage: a PyTorch variant's exported graph, run in onnxruntime (``lite`` -> ``lite_ort``).

The pipeline's graph step (compress/graph_step.py) exports every PyTorch variant right after
scoring it; this stage takes that graph (``source.artifacts["onnx"]``) and serves it through the
same runtime as the original voice (its family's reference runtime), so the CPU engine is scored
like any variant:

    variant = build(lite, None, ctx)   # ctx: compress.variants.StageContext
"""
from __future__ import annotations

from compress.registration import GRAPH_ARTIFACT
from compress.variants import StageContext, Variant, reference_runtime
from evaluate.memory import file_size_mb


def build(source: Variant, settings: None, ctx: StageContext, variant_name: str = "lite_ort") -> Variant:
    graph = source.artifacts.get(GRAPH_ARTIFACT)
    if graph is None or not graph.is_file():
        raise ValueError(
            f"{variant_name} needs the ONNX graph of {source.name!r}, which the graph step did not make "
            f"(its graph_status tag says why; export.enabled must be true)"
        )
    model = reference_runtime(ctx.family, variant_name).load_graph(ctx.voice, ctx.cpu_threads, graph)
    return Variant(variant_name, model, "onnxruntime", "cpu", model.num_parameters / 1e6, file_size_mb(graph),
                   stage_tags={"graph_source": source.name}, artifacts={"source_graph": graph})
