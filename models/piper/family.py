"""Piper (VITS) as a registered family: loaders, parts, sampling and its original ONNX graph."""
from __future__ import annotations

from pathlib import Path

from models.family import Family, GpuEngines, ReferenceRuntime
from models.piper.capabilities import CAPABILITIES, FAMILY_NAME, PART_ROLES
from models.piper.engines import bucketed_engine
from models.piper.gpu_bundle import ENGINE_PLAN, GRAPH_MODES, build_engine, engine_variants
from models.piper.onnx_contract import graph_contracts
from models.piper.onnx_runtime import PiperOnnxRuntimeVoice, prepare_graph
from models.piper.quantization import QUANTIZATION
from models.piper.tiny import tiny_voice
from models.piper.training.hooks import DISTIL_HOOKS, PRUNE_HOOKS
from models.piper.triton_graph import TRITON
from models.piper.voice import PiperVoice
from models.piper.voice_files import PiperVoiceFiles
from models.sampling import VitsSampling


def _load_teacher(voice: str, cache_dir: Path) -> PiperVoice:
    return PiperVoice.load(voice, Path(cache_dir))


REFERENCE = ReferenceRuntime(
    load=lambda voice, threads: PiperOnnxRuntimeVoice(voice, threads=threads),
    load_graph=lambda voice, threads, graph_path: PiperOnnxRuntimeVoice(voice, threads=threads, graph_path=graph_path),
    graph_path=lambda voice: PiperVoiceFiles.resolve(voice).onnx_path,
    prepare_graph=prepare_graph,
)

FAMILY = Family(
    name=FAMILY_NAME,
    capabilities=CAPABILITIES,
    sampling_type=VitsSampling,
    part_roles=PART_ROLES,
    load_teacher=_load_teacher,
    tiny_model=tiny_voice,
    default_voice="bundled:joe",
    reference=REFERENCE,
    graph_contracts=graph_contracts,
    torch_engine=bucketed_engine,
    gpu_engines=GpuEngines(plan=ENGINE_PLAN, graph_modes=GRAPH_MODES, variants=engine_variants, build_engine=build_engine),
    quantization=QUANTIZATION,
    triton=TRITON,
    prune=PRUNE_HOOKS,
    distil=DISTIL_HOOKS,
)
