"""Score one variant on a sentence set: speed, memory and quality, under stable metric names.

This is the single evaluation path: the teacher, the original ONNX and every compressed
variant go through ``evaluate_variant`` with the same settings, so their numbers compare.
The reference variant (the teacher) is scored first; MCD and speaker similarity of every
other variant are measured against its audio for the same text and the same sampling.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from evaluate.asr import error_rate_metric
from evaluate.memory import PeakRssSampler
from evaluate.rtf import measure_batch1, measure_batched
from evaluate.settings import EvaluateSettings
from models.interface import Utterance
from models.sampling import Sampling


@dataclass
class EvaluationSet:
    """Sentences after the frontend, with the frontend's time per sentence and fixed sampling."""

    sequences: list[Utterance]
    frontend_s: list[float]
    samplings: list[Sampling]  # one per sequence, in the model family's sampling type

    @classmethod
    def build(cls, sentences: list[str], model, sampling: Sampling) -> "EvaluationSet":
        """``sampling``: the first utterance's; utterance i draws from ``sampling.seed + i``."""
        sequences, frontend_s = [], []
        for sentence in sentences:
            start = time.perf_counter()
            parts = model.text_to_utterances(sentence)
            elapsed = time.perf_counter() - start
            sequences += parts
            # Time to first audio only waits for the first sentence's phonemes.
            frontend_s += [elapsed / len(parts)] * len(parts)
        samplings = [dataclasses.replace(sampling, seed=sampling.seed + i) for i in range(len(sequences))]
        return cls(sequences, frontend_s, samplings)


@dataclass
class VariantEvaluation:
    metrics: dict[str, float]
    waveforms: list[torch.Tensor]  # (T_audio_i,) per utterance, batch 1
    sample_rate_hz: int


def _quality_metrics(
    waveforms: list[torch.Tensor],
    sample_rate_hz: int,
    texts: list[str],
    settings: EvaluateSettings,
    reference: VariantEvaluation | None,
    recognizer,
) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if "dnsmos" in settings.metrics:
        from evaluate.dnsmos import DNSMOSP808

        p808 = DNSMOSP808(intra_op_threads=settings.cpu_threads)
        for wave in tqdm(waveforms, desc="  dnsmos p808", leave=False):
            p808.update(wave, sample_rate_hz)
        metrics["dnsmos_p808"] = float(p808.compute())
    if "dnsmos_p835" in settings.metrics:
        from evaluate.dnsmos import DNSMOSP835

        p835 = DNSMOSP835(intra_op_threads=settings.cpu_threads)
        for wave in tqdm(waveforms, desc="  dnsmos p835", leave=False):
            p835.update(wave, sample_rate_hz)
        metrics.update({f"dnsmos_{k}": float(v) for k, v in p835.compute().items()})
    if "wer" in settings.metrics:
        name, error_rate = error_rate_metric(recognizer)  # wer, or cer for languages without spaces
        for wave, text in tqdm(list(zip(waveforms, texts)), desc="  asr", leave=False):
            error_rate.update(wave, sample_rate_hz, text)
        metrics[name] = float(error_rate.compute())
    if reference is not None and "mcd" in settings.metrics:
        from evaluate.mcd import MelCepstralDistortion

        mcd = MelCepstralDistortion()
        for wave, ref in zip(waveforms, reference.waveforms):
            mcd.update(wave, ref, sample_rate_hz)
        metrics["mcd_db"] = float(mcd.compute())
    if reference is not None and "spk_sim" in settings.metrics:
        from evaluate.speaker import SpeakerSimilarity

        similarity = SpeakerSimilarity()
        for wave, ref in zip(waveforms, reference.waveforms):
            similarity.update(wave, ref, sample_rate_hz)
        if similarity.scored_pairs:  # none when the reference never speaks (random weights): no spk_sim
            metrics["spk_sim"] = float(similarity.compute())
        metrics["spk_sim_silenced_utterances"] = similarity.silenced_pairs
        metrics["spk_sim_unscored_utterances"] = similarity.unscored_pairs
    for name in ("wer", "cer"):
        if reference is not None and name in metrics and name in reference.metrics:
            metrics[f"{name}_vs_teacher"] = metrics[name] - reference.metrics[name]
    return metrics


def evaluate_variant(
    variant,
    evaluation_set: EvaluationSet,
    settings: EvaluateSettings,
    reference: VariantEvaluation | None = None,
    recognizer=None,
    timed: bool = True,
) -> VariantEvaluation:
    """``variant``: a compress.variants.Variant. ``reference``: the teacher's evaluation, or None
    when this variant is the reference itself (then MCD and speaker similarity are not logged).
    ``timed=False`` synthesizes each sentence once for quality only: for GPU-only precisions,
    whose CPU kernels say nothing about how they ship (their speed comes from the GPU benchmark)."""
    device_kind = "cuda" if variant.device.startswith("cuda") else "cpu"
    progress = lambda items: tqdm(items, desc=f"{variant.name}: synthesize", unit="sent")  # noqa: E731
    warm_runs, warmup_runs = (settings.warm_runs, settings.warmup_runs) if timed else (1, 0)
    with PeakRssSampler() as rss:
        speed, results = measure_batch1(
            variant.model.synthesize, evaluation_set.sequences, evaluation_set.samplings,
            warm_runs, warmup_runs, variant.device, evaluation_set.frontend_s, progress,
        )
        batched_rtf = measure_batched(
            variant.model.synthesize, evaluation_set.sequences, settings.cpu_batch_size,
            evaluation_set.samplings[0], warm_runs, warmup_runs, variant.device,
        ) if timed else None
    waveforms = [result.waveforms()[0] for result in results]
    sample_rate_hz = results[0].sample_rate_hz
    metrics = {
        "params_m": variant.params_m,
        "size_mb": variant.size_mb,
        "audio_seconds": sum(t.audio_s for t in speed.per_utterance),
    }
    if timed:
        metrics.update({
            f"rtf_{device_kind}_b1": speed.rtf_b1,
            f"rtf_{device_kind}_b1_median_utterance": speed.rtf_b1_median_utterance,
            f"rtf_{device_kind}_b{settings.cpu_batch_size}": batched_rtf,
            "latency_first_audio_ms": speed.latency_first_audio_ms,
            "rss_peak_mib": rss.peak_mib,
        })
    texts = [sequence.text for sequence in evaluation_set.sequences]
    metrics.update(_quality_metrics(waveforms, sample_rate_hz, texts, settings, reference, recognizer))
    return VariantEvaluation(metrics, waveforms, sample_rate_hz)
