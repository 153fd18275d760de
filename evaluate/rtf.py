"""Real-time factor: compute seconds per second of audio, medians over warm runs.

Light on purpose (torch + numpy only) so the GPU benchmark can import it on a bare machine.

* batch 1: every utterance is timed ``warm_runs`` times after ``warmup_runs``; its compute time
  is the median. ``rtf_b1`` aggregates over the set: sum of medians / sum of audio seconds.
* batched: utterances sorted by length (least padding) and grouped; same aggregate.
* time to first audio: frontend + synthesis of the first sentence, median over utterances;
* interleaved rounds: every model of a run timed over the whole set once per round, in turn, so
  figures that are compared come from the same stretch of the machine's time, with a spread.
CUDA work is synchronised before each clock read.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from models.interface import SynthesisRequest, SynthesisResult, Utterance
from models.sampling import VitsSampling

Synthesize = Callable[[SynthesisRequest], SynthesisResult]


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_median(fn: Callable[[], SynthesisResult], warm_runs: int, warmup_runs: int, device: str):
    """(median seconds over warm runs, result of the last run)."""
    if warm_runs < 1 or warmup_runs < 0:
        raise ValueError(f"warm_runs must be >= 1 and warmup_runs >= 0, got {warm_runs}, {warmup_runs}")
    result = None
    for _ in range(warmup_runs):
        result = fn()
    seconds = []
    for _ in range(warm_runs):
        _synchronize(device)
        start = time.perf_counter()
        result = fn()
        _synchronize(device)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


@dataclass
class UtteranceTiming:
    compute_s: float
    audio_s: float

    @property
    def rtf(self) -> float:
        return self.compute_s / self.audio_s


@dataclass
class SpeedReport:
    rtf_b1: float
    rtf_b1_median_utterance: float
    latency_first_audio_ms: float
    rtf_batched: float | None = None
    batch_size: int | None = None
    per_utterance: list[UtteranceTiming] = field(default_factory=list)


def _audio_seconds(result: SynthesisResult) -> float:
    return float(result.audio_lengths.sum()) / result.sample_rate_hz


def measure_batch1(
    synthesize: Synthesize,
    sequences: list[Utterance],
    noises: list[VitsSampling],
    warm_runs: int = 3,
    warmup_runs: int = 1,
    device: str = "cpu",
    frontend_s: list[float] | None = None,
    progress: Callable | None = None,
) -> tuple[SpeedReport, list[SynthesisResult]]:
    """Time each sequence alone; returns the report and each utterance's (last) result."""
    timings, results = [], []
    iterator = progress(range(len(sequences))) if progress else range(len(sequences))
    for i in iterator:
        request = SynthesisRequest.from_utterances([sequences[i]], sampling=noises[i])
        compute_s, result = timed_median(lambda: synthesize(request), warm_runs, warmup_runs, device)
        timings.append(UtteranceTiming(compute_s, _audio_seconds(result)))
        results.append(result)
    frontend_s = frontend_s or [0.0] * len(timings)
    report = SpeedReport(
        rtf_b1=sum(t.compute_s for t in timings) / sum(t.audio_s for t in timings),
        rtf_b1_median_utterance=statistics.median(t.rtf for t in timings),
        latency_first_audio_ms=1000 * statistics.median(t.compute_s + f for t, f in zip(timings, frontend_s)),
        per_utterance=timings,
    )
    return report, results


def length_sorted_batches(sequences: list[Utterance], batch_size: int, sampling) -> list[SynthesisRequest]:
    """``sequences`` sorted by length and cut into requests of ``batch_size`` (the last one shorter),
    each with ``sampling``: how every batched figure here is measured."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ordered = sorted(sequences, key=lambda s: len(s.phoneme_ids))
    return [SynthesisRequest.from_utterances(ordered[start : start + batch_size], sampling=sampling)
            for start in range(0, len(ordered), batch_size)]


def measure_batched(
    synthesize: Synthesize,
    sequences: list[Utterance],
    batch_size: int,
    noise: VitsSampling,
    warm_runs: int = 3,
    warmup_runs: int = 1,
    device: str = "cpu",
) -> float:
    """Aggregate RTF over length-sorted batches of ``batch_size``."""
    compute_s = audio_s = 0.0
    for request in length_sorted_batches(sequences, batch_size, noise):
        seconds, result = timed_median(lambda: synthesize(request), warm_runs, warmup_runs, device)
        compute_s += seconds
        audio_s += _audio_seconds(result)
    return compute_s / audio_s


def interleaved_rtf(synthesizers: dict[str, Synthesize], sequences: list[Utterance], samplings: list,
                    rounds: int, warmup_runs: int = 1, device: str = "cpu") -> dict[str, list[float]]:
    """Batch-1 RTF over all ``sequences``, once per round for every model in turn: name -> one RTF per
    round. The order rotates each round, so a slow drift of the machine (heat, other load) falls on
    every model alike, and the spread over rounds says how far one figure can be trusted."""
    if rounds < 1 or warmup_runs < 0:
        raise ValueError(f"rounds must be >= 1 and warmup_runs >= 0, got {rounds}, {warmup_runs}")
    names = list(synthesizers)
    requests = [SynthesisRequest.from_utterances([s], sampling=x) for s, x in zip(sequences, samplings, strict=True)]
    for name in names:
        for _ in range(warmup_runs):
            synthesizers[name](requests[0])
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            compute_s = audio_s = 0.0
            for request in requests:
                _synchronize(device)
                start = time.perf_counter()
                result = synthesizers[name](request)
                _synchronize(device)
                compute_s += time.perf_counter() - start
                audio_s += _audio_seconds(result)
            per_round[name].append(compute_s / audio_s)
    return per_round
