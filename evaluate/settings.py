"""Typed settings of the evaluate config group (conf/evaluate), checked at start."""
from __future__ import annotations

from dataclasses import dataclass

from core.config import ConfigError

KNOWN_METRICS = ("dnsmos", "wer", "mcd", "spk_sim")


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
    gpu_results: str | None = None

    def __post_init__(self):
        if self.cpu_threads < 1 or self.warm_runs < 1 or self.warmup_runs < 0 or self.cpu_batch_size < 1:
            raise ConfigError(
                "evaluate: cpu_threads, warm_runs and cpu_batch_size must be >= 1, warmup_runs >= 0 "
                f"(got {self.cpu_threads}, {self.warm_runs}, {self.cpu_batch_size}, {self.warmup_runs})"
            )
        unknown = sorted(set(self.metrics) - set(KNOWN_METRICS))
        if unknown:
            raise ConfigError(f"evaluate.metrics: unknown {unknown}; known: {list(KNOWN_METRICS)}")
