"""The one interface every TTS family implements, so stages and the server never touch internals.

A family (models/<family>/, listed in models/registry.py) provides a model that offers:

* a text frontend: ``text -> list[Utterance]`` (one per sentence);
* ``synthesize(SynthesisRequest) -> SynthesisResult`` on padded batches;
* named replaceable parts (``parts()``), which compression stages prune, quantize, distil or swap;
* its ``capabilities``, which generic code reads instead of the family's name.

Conditioning that only some families use travels in ``VoiceCondition`` (each field optional). A
model refuses conditioning its capabilities do not list with a ValueError rather than ignoring it.
"""
from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from models.sampling import Sampling

STREAMING_UNITS = ("sentence", "decoder_frames", "tokens")


class UnspeakableTextError(ValueError):
    """Text the frontend cannot turn into symbols the voice knows (empty, or unknown symbols)."""


@dataclass(frozen=True)
class Utterance:
    """One sentence after the text frontend: its text, symbols and the model's ids for them."""

    text: str
    phonemes: tuple[str, ...]
    phoneme_ids: tuple[int, ...]


@dataclass(frozen=True)
class ReferenceClip:
    """A zero-shot voice prompt: audio and, for families that align it, what it says."""

    waveform: torch.Tensor  # (T_audio,) float in [-1, 1]
    sample_rate_hz: int
    transcript: str | None = None


@dataclass
class VoiceCondition:
    """Who speaks and how; every field optional, a family uses those its capabilities name."""

    speaker_id: torch.Tensor | None = None  # (B,) int64: a speaker table row
    reference_embedding: torch.Tensor | None = None  # (B, D_ref) float: a d-vector of a reference clip
    reference: ReferenceClip | None = None  # a zero-shot clip the family encodes itself
    style: torch.Tensor | None = None  # (B, D_style) float: a style vector / prompt embedding
    prompt: str | None = None  # a natural-language style or emotion prompt
    emotion: str | None = None  # a named emotion the family knows

    def given(self) -> tuple[str, ...]:
        """Names of the fields that are set."""
        return tuple(name for name, value in vars(self).items() if value is not None)


@dataclass(frozen=True)
class Capabilities:
    """What a family can take and do; stages and the server read these, never the family's name."""

    speaker_ids: bool = False  # a speaker table (VoiceCondition.speaker_id)
    zero_shot: bool = False  # a reference clip conditions the voice (VoiceCondition.reference)
    zero_shot_needs_transcript: bool = False
    prompt_style: bool = False  # a text style / emotion prompt (VoiceCondition.prompt / emotion)
    emotions: tuple[str, ...] = ()  # the named emotions a prompt_style family knows; () takes any name
    autoregressive: bool = False  # tokens are decoded one step at a time (a token-step scheduler)
    streaming_unit: str = "sentence"  # the smallest piece of audio it can hand out early
    durations: bool = True  # its results carry frames per phoneme id

    def __post_init__(self):
        if self.streaming_unit not in STREAMING_UNITS:
            raise ValueError(f"streaming_unit={self.streaming_unit!r}: use one of {list(STREAMING_UNITS)}")

    def accepted_conditions(self) -> tuple[str, ...]:
        """The VoiceCondition fields a model with these capabilities takes."""
        accepted = []
        if self.speaker_ids:
            accepted.append("speaker_id")
        if self.zero_shot:
            accepted += ["reference_embedding", "reference"]
        if self.prompt_style:
            accepted += ["style", "prompt", "emotion"]
        return tuple(accepted)

    def check(self, condition: VoiceCondition | None, family: str) -> None:
        """Raise ValueError naming the conditioning ``family`` cannot use."""
        refused = sorted(set(condition.given() if condition else ()) - set(self.accepted_conditions()))
        if refused:
            raise ValueError(f"family {family} takes no {refused}; it accepts {list(self.accepted_conditions())}")
        if condition is not None and not self.knows_emotion(condition.emotion):
            raise ValueError(f"family {family} knows no emotion {condition.emotion!r}; use one of {list(self.emotions)}")

    def knows_emotion(self, emotion: str | None) -> bool:
        """Whether ``emotion`` (None: none asked for) is one this family can speak with."""
        return emotion is None or not self.emotions or emotion in self.emotions


@dataclass
class SynthesisRequest:
    """A padded batch of phoneme ids, how to sample, and optional voice conditioning."""

    phoneme_ids: torch.Tensor  # (B, T_text) int64, right-padded
    phoneme_lengths: torch.Tensor  # (B,) int64
    sampling: Sampling = field(default_factory=Sampling)
    voice: VoiceCondition | None = None

    @classmethod
    def from_utterances(cls, utterances: list[Utterance], **kwargs) -> SynthesisRequest:
        if not utterances:
            raise ValueError("SynthesisRequest needs at least one utterance, got none")
        lengths = torch.tensor([len(u.phoneme_ids) for u in utterances], dtype=torch.long)
        ids = torch.zeros(len(utterances), int(lengths.max()), dtype=torch.long)  # (B, T_text)
        for row, utterance in enumerate(utterances):
            ids[row, : len(utterance.phoneme_ids)] = torch.tensor(utterance.phoneme_ids, dtype=torch.long)
        return cls(phoneme_ids=ids, phoneme_lengths=lengths, **kwargs)


@dataclass
class SynthesisResult:
    audio: torch.Tensor  # (B, T_audio) float in [-1, 1], right-padded
    audio_lengths: torch.Tensor  # (B,) int64 samples
    sample_rate_hz: int
    durations: torch.Tensor | None = None  # (B, T_text) int64 frames per phoneme, where the family has them
    tokens: torch.Tensor | None = None  # (B, T_tokens) int64 semantic tokens of an autoregressive family

    def waveforms(self) -> list[torch.Tensor]:
        """Unpadded waveforms, one (T_audio_i,) tensor per batch item."""
        return [self.audio[i, : int(n)] for i, n in enumerate(self.audio_lengths)]


@runtime_checkable
class TTSModel(Protocol):
    """What compression stages, evaluation and serving rely on."""

    family: str
    sample_rate_hz: int
    hop_length: int  # output samples per acoustic frame (one spectrogram column)
    capabilities: Capabilities
    sampling_type: type[Sampling]

    def text_to_utterances(self, text: str) -> list[Utterance]: ...

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult: ...

    def parts(self) -> dict[str, nn.Module]:
        """Replaceable parts by role; the family's registry entry lists the roles."""
        ...

    def replace_part(self, role: str, module: nn.Module) -> None:
        """Swap the part playing ``role`` for a module with the same call signature."""
        ...


@runtime_checkable
class TokenStepDecoder(Protocol):
    """Continuous batching of an autoregressive model (``capabilities.autoregressive``): sentences join
    and leave the decode batch between token steps, so a short sentence never waits for the longest
    row of a batch to finish. The model hands one out with ``step_decoder(max_rows)``.

    Calls come from one thread (the server's model thread); nothing here is thread-safe.
    """

    max_rows: int  # rows decoded together at most
    active: int  # rows decoding now

    def join(self, key: Hashable, request: SynthesisRequest) -> None:
        """Start decoding ``request`` (one sentence, B = 1) as row ``key``: its prompt is prefilled now,
        its tokens come with the next steps. A ValueError when no row is free or the request is bad."""
        ...

    def step(self) -> list[tuple[Hashable, SynthesisResult]]:
        """One token step for every active row; the rows that finished with it, each with its audio."""
        ...

    def cancel(self, key: Hashable) -> None:
        """Drop row ``key`` (its client left); a key not decoding is ignored."""
        ...


@runtime_checkable
class StreamingTokenStepDecoder(TokenStepDecoder, Protocol):
    """A ``TokenStepDecoder`` whose rows hand out audio while they decode (``capabilities.streaming_unit``
    ``tokens``): driven by ``step_chunks`` instead of ``step``, never both."""

    def step_chunks(self) -> list[tuple[Hashable, torch.Tensor, bool]]:
        """One token step for every active row; the audio chunks made with it: (key, waveform (T,), last),
        in order within a row. A row's chunks joined are its sentence's audio; its last one (last=True)
        comes with the step it finishes at."""
        ...
