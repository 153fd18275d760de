"""Which DNSMOS models run follows evaluate.metrics: P.808 and the costlier P.835 are chosen apart."""
import numpy as np
import pytest
import torch

from core.config import ConfigError
from evaluate.runner import _quality_metrics
from evaluate.settings import EvaluateSettings, SamplingSettings


def _settings(metrics: tuple[str, ...]) -> EvaluateSettings:
    return EvaluateSettings(cpu_threads=1, warm_runs=1, warmup_runs=0, cpu_batch_size=1, reference_variant="teacher",
                            sampling=SamplingSettings(seed=0, length_scale=1.0), metrics=metrics, audio_samples=0)


@pytest.fixture(scope="module")
def tone() -> list[torch.Tensor]:
    t = np.arange(16_000 * 2) / 16_000
    return [torch.from_numpy((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))]  # (32000,)


def test_p808_alone_skips_the_p835_scores(tone):
    metrics = _quality_metrics(tone, 16_000, ["a tone"], _settings(("dnsmos",)), None, None)
    assert set(metrics) == {"dnsmos_p808"}
    assert 1.0 <= metrics["dnsmos_p808"] <= 5.0


def test_p835_alone_gives_its_three_scores(tone):
    metrics = _quality_metrics(tone, 16_000, ["a tone"], _settings(("dnsmos_p835",)), None, None)
    assert set(metrics) == {"dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl"}
    assert all(np.isfinite(value) for value in metrics.values())  # a pure tone may fall below 1 on the fitted scale


def test_an_unknown_metric_fails_at_start():
    with pytest.raises(ConfigError, match="dnsmos_p800"):
        _settings(("dnsmos_p800",))
