"""Where a GPT-SoVITS v2 voice's files are, and loading a voice from them.

The files are the user's (not committed), as the official project ships and trains them:

* ``model.gpt``: a text-to-semantic checkpoint ``s1*.ckpt`` (``GPT_weights_v2/`` or
  ``pretrained_models/gsv-v2final-pretrained/s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt``);
* ``model.sovits``: a synthesizer ``s2G*.pth`` (``SoVITS_weights_v2/`` or the pretrained ``s2G2333k.pth``);
* ``model.hubert``: the ``chinese-hubert-base`` folder (config.json + weights);
* ``model.bert``: the ``chinese-roberta-wwm-ext-large`` folder (config.json, weights, tokenizer files);
* ``model.reference_audio`` and ``model.reference_text``: the default voice, a 3-10 s clip and what it
  says (any other voice is a clip uploaded to the server, or ``VoiceCondition.reference``).

conf/model/gpt_sovits_v2.yaml folds these into one voice string that ``GptSovitsFiles.parse`` reads;
with none of them set (``random``) the voice has full-size random weights built from the official
manifests in models/gpt_sovits/data/ and a synthetic reference clip: speed and memory are real,
the audio is not speech.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

import soundfile
import torch

from models.gpt_sovits.sovits_checkpoint import (
    load_sovits_checkpoint,
    sovits_from_manifest,
)
from models.gpt_sovits.ssl_encoders import (
    load_bert,
    load_hubert,
    random_bert,
    random_hubert,
)
from models.gpt_sovits.t2s_checkpoint import load_t2s_checkpoint, t2s_from_manifest
from models.gpt_sovits.t2s_decode import max_tokens_for_early_stop
from models.gpt_sovits.voice import GptSovitsVoice
from models.interface import ReferenceClip
from models.voice_spec import is_random, is_unset, parse_paths

DATA_DIR = Path(__file__).resolve().parent / "data"
T2S_MANIFEST = DATA_DIR / "manifest_official_t2s.json"
SOVITS_MANIFEST = DATA_DIR / "manifest_official_sovits.json"
RANDOM_MAX_SEC = 54  # the official v2 training config's max_sec: early stop after 2700 tokens
# Random weights almost never sample EOS, so every sentence would decode the whole 2700 tokens (54 s;
# 146 sentences at this CPU's 20-25 tokens/s: about 5 hours for one variant). They stop instead after the
# tokens a speaker needs for the sentence: at about 10 phones a second (Mandarin's 4-5 syllables a
# second are two phones each; English runs 10-14) and 25 tokens a second, 2.5 tokens a phone, so
# timings and memory describe sentences of real length.
RANDOM_TOKENS_PER_PHONE = 2.5
SYNTHETIC_REFERENCE_TEXT = "Hello, this is the voice I would like you to speak in."


@dataclass(frozen=True)
class GptSovitsFiles:
    gpt: Path | None = None
    sovits: Path | None = None
    hubert: Path | None = None
    bert: Path | None = None
    reference_audio: Path | None = None
    reference_text: str | None = None

    @classmethod
    def parse(cls, voice: str) -> "GptSovitsFiles":
        """``random``, or ``gpt=PATH;sovits=PATH;hubert=DIR;bert=DIR;reference_audio=PATH;reference_text=TEXT``.
        ``reference_text`` comes last and runs to the end, so a transcript may hold ``;``."""
        if is_random(voice):
            return cls()
        known = {field.name for field in fields(cls)}
        paths, marker, transcript = voice.partition("reference_text=")
        values: dict[str, object] = parse_paths(voice, known - {"reference_text"}, paths)
        if marker and not is_unset(transcript):
            values["reference_text"] = transcript.strip()
        files = cls(**values)
        given = [name for name in sorted(known) if getattr(files, name) is not None]
        if given and len(given) < len(known):
            raise ValueError(f"voice {voice!r}: a GPT-SoVITS voice needs all of {sorted(known)}; missing "
                             f"{sorted(known - set(given))}. Or set none of them for full-size random weights")
        return files

    @property
    def is_random(self) -> bool:
        return self.gpt is None


def synthetic_reference(sample_rate_hz: int = 32000, seconds: float = 4.0) -> ReferenceClip:
    """A deterministic voiced-sounding clip (a 140 Hz harmonic series under a 4 Hz syllable envelope)
    with a transcript: the default voice of random weights, where no real clip means anything."""
    t = torch.arange(int(sample_rate_hz * seconds)) / sample_rate_hz  # (T,) seconds
    harmonics = sum(torch.sin(2 * math.pi * 140 * k * t) / k for k in range(1, 8))
    envelope = 0.5 * (1 - torch.cos(2 * math.pi * 4 * t))
    return ReferenceClip(0.2 * harmonics * envelope, sample_rate_hz, SYNTHETIC_REFERENCE_TEXT)


def _char_tokenizer(vocab_size: int):
    """BERT input ids for random weights, which have no vocabulary: one id per character between
    [CLS] and [SEP], as the Chinese tokenizer gives (the features mean nothing; their cost is real)."""
    def tokenize(text: str) -> torch.Tensor:
        ids = [101] + [1000 + ord(c) % (vocab_size - 1000) for c in text] + [102]
        return torch.tensor([ids], dtype=torch.long)
    return tokenize


def load_voice(files: GptSovitsFiles, language: str = "auto") -> GptSovitsVoice:
    """The voice the files describe, in float32 on the CPU."""
    if files.is_random:
        t2s = t2s_from_manifest(T2S_MANIFEST)
        sovits = sovits_from_manifest(SOVITS_MANIFEST).model
        bert = random_bert()
        return GptSovitsVoice(t2s, sovits, random_hubert(), bert, _char_tokenizer(bert.config.vocab_size),
                              synthetic_reference(sovits.config.sample_rate_hz),
                              max_tokens_for_early_stop(50 * RANDOM_MAX_SEC), language,
                              tokens_per_phone=RANDOM_TOKENS_PER_PHONE)
    t2s = load_t2s_checkpoint(files.gpt)
    sovits = load_sovits_checkpoint(files.sovits).model
    bert, tokenizer = load_bert(files.bert)
    waveform, sample_rate_hz = soundfile.read(str(files.reference_audio), dtype="float32", always_2d=True)
    reference = ReferenceClip(torch.from_numpy(waveform.mean(axis=1)), int(sample_rate_hz), files.reference_text)
    return GptSovitsVoice(t2s.model, sovits, load_hubert(files.hubert), bert,
                          lambda text: tokenizer(text, return_tensors="pt")["input_ids"], reference,
                          max_tokens_for_early_stop(t2s.early_stop_num), language)
