"""What a GPT-SoVITS v2 voice can take and do, and how it samples; read through the registry."""
from __future__ import annotations

from dataclasses import dataclass

from models.interface import Capabilities
from models.sampling import AutoregressiveSampling

FAMILY_NAME = "gpt_sovits_v2"
# A zero-shot family: every voice is a reference clip with its transcript (the transcript's phones
# and the clip's semantic tokens prefix the decode). Semantic tokens come one step at a time, 25 per
# second of audio, so the smallest piece of audio it can hand out is a run of tokens.
CAPABILITIES = Capabilities(zero_shot=True, zero_shot_needs_transcript=True, autoregressive=True,
                            streaming_unit="tokens", durations=False)
PART_ROLES = ("t2s", "sovits")  # the text-to-semantic transformer, then the synthesizer (codes -> audio)


@dataclass(frozen=True)
class GptSovitsSampling(AutoregressiveSampling):
    """The official v2 inference defaults: top-k 15, top-p 1, temperature 1, repetition penalty 1.35
    for the semantic tokens, and SoVITS prior noise at scale 0.5, drawn from the seed."""

    noise_scale: float = 0.5

    @classmethod
    def deterministic(cls, **values) -> "GptSovitsSampling":
        return cls(**{"top_k": 1, "noise_scale": 0.0, **values})
