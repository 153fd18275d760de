"""GPT-SoVITS v2 as a registered family: loaders, parts, sampling and its ONNX graph contracts.

    voice = FAMILY.load_teacher("random", cache_dir)   # full-size random weights (the official manifests)
    voice = FAMILY.load_teacher("gpt=s1.ckpt;sovits=s2G.pth;hubert=chinese-hubert-base;"
                                "bert=chinese-roberta-wwm-ext-large;reference_audio=me.wav;"
                                "reference_text=What the clip says.", cache_dir)

conf/model/gpt_sovits_v2.yaml builds that string from ``model.gpt``, ``model.sovits``, ``model.hubert``,
``model.bert``, ``model.reference_audio`` and ``model.reference_text`` (models/gpt_sovits/voice_files.py).

Its stages: ``lite`` (a 6-layer transformer distilled from the teacher's greedy sequences,
models/gpt_sovits/lite.py) and the generic ones (fp16, int8_dynamic on the transformer's Linear
layers); its own measures per variant (tokens/s, first chunk, cache memory, token agreement with the
teacher) are models/gpt_sovits/measures.py.
"""
from __future__ import annotations

from pathlib import Path

from models.family import Family
from models.gpt_sovits.capabilities import (
    CAPABILITIES,
    FAMILY_NAME,
    PART_ROLES,
    GptSovitsSampling,
)
from models.gpt_sovits.lite import DISTIL_HOOKS
from models.gpt_sovits.measures import measure_variant
from models.gpt_sovits.onnx_contract import graph_contracts
from models.gpt_sovits.tiny import tiny_voice
from models.gpt_sovits.voice import GptSovitsVoice
from models.gpt_sovits.voice_files import RANDOM_TOKENS_PER_PHONE, GptSovitsFiles, load_voice
from models.voice_spec import RANDOM


def _load_teacher(voice: str, cache_dir: Path) -> GptSovitsVoice:
    # The official files load directly; nothing is converted or cached (cache_dir is unused).
    return load_voice(GptSovitsFiles.parse(voice))


RANDOM_WEIGHTS_NOTE = ("full-size random weights (no model.gpt/model.sovits given): speed and memory are real; "
                       "quality (DNSMOS, MCD, spk_sim, token agreement) means nothing; as they never choose EOS, "
                       f"each sentence stops after {RANDOM_TOKENS_PER_PHONE:g} semantic tokens a phone "
                       "(a speaker's length)")


def _weights_note(voice: str) -> str | None:
    return RANDOM_WEIGHTS_NOTE if GptSovitsFiles.parse(voice).is_random else None


FAMILY = Family(
    name=FAMILY_NAME,
    capabilities=CAPABILITIES,
    sampling_type=GptSovitsSampling,
    part_roles=PART_ROLES,
    load_teacher=_load_teacher,
    tiny_model=tiny_voice,
    default_voice=RANDOM,
    graph_contracts=graph_contracts,
    distil=DISTIL_HOOKS,
    voice_fields=("gpt", "sovits", "hubert", "bert", "reference_audio", "reference_text"),
    measure_variant=measure_variant,
    weights_note=_weights_note,
)
