"""Typed settings of the evaluate config group (conf/evaluate), checked at start."""
from __future__ import annotations

from dataclasses import dataclass

from core.config import ConfigError

# "dnsmos": P.808 MOS; "dnsmos_p835": its signal/background/overall scores, a larger model (about 1.8 s
# an utterance on 2 cores against 0.15 s for P.808); "wer": recognition error rate (CER for zh/ja)
KNOWN_METRICS = ("dnsmos", "dnsmos_p835", "wer", "mcd", "spk_sim")
RECOGNIZERS = ("whisper", "pocketsphinx_domain")
WHISPER_MODELS = ("tiny.en", "base")  # evaluate/asr.py


@dataclass(frozen=True)
class RecognizerSettings:
    """Who transcribes the audio for the error rate.

    ``whisper`` (evaluate/asr.py) knows nothing of the sentences it scores. ``pocketsphinx_domain``
    (evaluate/intelligibility.py) decodes with a language model written from those very sentences:
    it scores every voice near 0, so it is kept only to compare with earlier runs.
    """

    kind: str = "whisper"
    model: str | None = None  # whisper only: tiny.en (English) or base (multilingual); None: by the voice's language

    def __post_init__(self):
        if self.kind not in RECOGNIZERS:
            raise ConfigError(f"evaluate.recognizer.kind={self.kind!r}: use one of {list(RECOGNIZERS)}")
        if self.model is not None and self.model not in WHISPER_MODELS:
            raise ConfigError(f"evaluate.recognizer.model={self.model!r}: use one of {list(WHISPER_MODELS)} or null")

    def whisper_model(self, language: str) -> str:
        """The Whisper model that transcribes a voice speaking ``language`` (BCP 47); a ConfigError
        when the chosen one cannot (an English-only model for another language)."""
        if self.model is None:
            return default_whisper_model(language)
        if self.model.endswith(".en") and not is_english(language):
            raise ConfigError(f"evaluate.recognizer.model={self.model!r} is English only and the voice speaks "
                              f"{language!r}: use base, or null to choose by language")
        return self.model


def is_english(language: str) -> bool:
    return language.split("-")[0].lower() == "en"


def default_whisper_model(language: str) -> str:
    """tiny.en for English (0.35 s a sentence on 2 threads), else multilingual base."""
    return "tiny.en" if is_english(language) else "base"


@dataclass(frozen=True)
class SamplingSettings:
    """What every family's sampling shares; a family's own options come with the model (model.sampling)."""

    seed: int  # utterance i uses seed + i
    length_scale: float

    def __post_init__(self):
        if self.length_scale <= 0:
            raise ConfigError(f"evaluate.sampling.length_scale={self.length_scale}: must be > 0")


@dataclass(frozen=True)
class EvaluateSettings:
    cpu_threads: int
    warm_runs: int
    warmup_runs: int
    cpu_batch_size: int
    reference_variant: str
    sampling: SamplingSettings
    metrics: tuple[str, ...]
    audio_samples: int
    recognizer: RecognizerSettings = RecognizerSettings()
    # CPU-timed variants re-timed together this many times, interleaved (evaluate.rtf.interleaved_rtf):
    # rtf_cpu_b1 is the median of the rounds, rtf_cpu_b1_spread their range. 0: timed once, alone.
    speed_rounds: int = 3
    gpu_results: str | None = None

    def __post_init__(self):
        if self.cpu_threads < 1 or self.warm_runs < 1 or self.warmup_runs < 0 or self.cpu_batch_size < 1:
            raise ConfigError(
                "evaluate: cpu_threads, warm_runs and cpu_batch_size must be >= 1, warmup_runs >= 0 "
                f"(got {self.cpu_threads}, {self.warm_runs}, {self.cpu_batch_size}, {self.warmup_runs})"
            )
        if self.speed_rounds != 0 and self.speed_rounds < 3:
            raise ConfigError(f"evaluate.speed_rounds={self.speed_rounds}: use 0 (timed once) or >= 3 rounds, "
                              "the fewest that give a median and a spread")
        unknown = sorted(set(self.metrics) - set(KNOWN_METRICS))
        if unknown:
            raise ConfigError(f"evaluate.metrics: unknown {unknown}; known: {list(KNOWN_METRICS)}")
