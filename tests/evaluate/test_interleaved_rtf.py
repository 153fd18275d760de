"""evaluate.rtf.interleaved_rtf: every model timed once per round, in a rotating order."""
from __future__ import annotations

import pytest
import torch

from evaluate.rtf import interleaved_rtf
from models.interface import SynthesisResult, Utterance
from models.sampling import Sampling

SAMPLE_RATE_HZ = 1000


def _recording(name: str, calls: list[str]):
    def synthesize(request) -> SynthesisResult:
        calls.append(name)
        lengths = torch.full((1,), SAMPLE_RATE_HZ)  # one second of audio per sentence
        return SynthesisResult(torch.zeros(1, SAMPLE_RATE_HZ), lengths, SAMPLE_RATE_HZ)
    return synthesize


def test_rounds_rotate_the_order_and_give_one_rtf_per_round():
    calls: list[str] = []
    names = ("a", "b", "c")
    sequences = [Utterance("x", ("x",), (1, 2, 3)), Utterance("y", ("y",), (1, 4))]
    samplings = [Sampling(seed=0), Sampling(seed=1)]
    per_round = interleaved_rtf({n: _recording(n, calls) for n in names}, sequences, samplings, rounds=3,
                                warmup_runs=1)
    assert calls[:3] == ["a", "b", "c"]  # warm-up: one call each
    timed = calls[3:]
    assert [timed[i] for i in range(0, len(timed), 2)] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {name: len(values) for name, values in per_round.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(value >= 0 for values in per_round.values() for value in values)


def test_no_rounds_is_refused():
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        interleaved_rtf({}, [], [], rounds=0)
