"""EmotiVoice as a registered family: loaders, parts, sampling and its ONNX graph contract.

    voice = FAMILY.load_teacher("random", cache_dir)   # full-size random weights (manifests)
    voice = FAMILY.load_teacher("checkpoint=.../g_00140000;style_encoder=.../checkpoint_163431;"
                                "data_dir=.../data/youdao/text", cache_dir)

conf/model/emotivoice.yaml builds that string from ``model.checkpoint``, ``model.style_encoder`` and
``model.data_dir`` (models/emotivoice/voice_files.py lists the files).

Stages: INT8 of the acoustic model and the vocoder (models/emotivoice/quantization.py), channel
pruning of the vocoder and a Lite vocoder distilled from the teacher's mel -> audio
(models/emotivoice/stage_hooks.py).
"""
from __future__ import annotations

from pathlib import Path

from models.emotivoice.capabilities import CAPABILITIES, FAMILY_NAME, PART_ROLES
from models.emotivoice.engine_voice import ServedEngineOptions, bucketed_engine
from models.emotivoice.onnx_contract import graph_contracts
from models.emotivoice.quantization import QUANTIZATION
from models.emotivoice.stage_hooks import DISTIL_HOOKS, PRUNE_HOOKS
from models.emotivoice.tiny import tiny_voice
from models.emotivoice.voice import EmotiVoiceVoice
from models.emotivoice.voice_files import EmotiVoiceFiles, load_voice
from models.family import Family
from models.sampling import Sampling
from models.voice_spec import RANDOM


RANDOM_WEIGHTS_NOTE = ("full-size random weights (no model.checkpoint/model.style_encoder given): speed and memory "
                       "are real; quality (DNSMOS, CER, MCD, spk_sim) means nothing")


def _weights_note(voice: str) -> str | None:
    return RANDOM_WEIGHTS_NOTE if EmotiVoiceFiles.parse(voice).is_random else None


def _load_teacher(voice: str, cache_dir: Path) -> EmotiVoiceVoice:
    # Nothing is converted or cached: the released files load directly (cache_dir is unused).
    return load_voice(EmotiVoiceFiles.parse(voice))


FAMILY = Family(
    name=FAMILY_NAME,
    capabilities=CAPABILITIES,
    sampling_type=Sampling,
    part_roles=PART_ROLES,
    load_teacher=_load_teacher,
    tiny_model=tiny_voice,
    default_voice=RANDOM,
    graph_contracts=graph_contracts,
    torch_engine=bucketed_engine,
    engine_options=ServedEngineOptions,
    quantization=QUANTIZATION,
    prune=PRUNE_HOOKS,
    distil=DISTIL_HOOKS,
    voice_fields=("checkpoint", "style_encoder", "data_dir", "bert_dir"),
    speaker_names=lambda voice: tuple(voice.speakers),  # speaker2's names ("8051"), the server's voices
    weights_note=_weights_note,
)
