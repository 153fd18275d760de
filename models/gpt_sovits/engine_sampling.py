"""On-device token choice for the T2S engine: tensors in, tensors out, no host round trip.

Every row carries its own settings as tensors, so one captured CUDA graph serves a batch whose
requests sample differently. The order is the official one:

    EOS column blocked before step ``eos_from_step`` (official: 11)
    -> repetition penalty on every id seen so far (prompt and generated): x < 0 ? x * p : x / p
    -> top-p on the penalised logits (skipped where top_p >= 1)
    -> / temperature -> top-k (ties with the k-th value kept) -> softmax -> exponential race

    token, stop_by_eos = choose_tokens(logits, seen, settings, step, eos_id, generator, greedy=False)

``greedy=True`` is the top_k = 1 path: the argmax of the penalised logits, which is what the
official race returns when only the maximum survives top-k. Both paths also report whether the
row stops on EOS: the official loop stops when the sampled token or the argmax of the penalised
logits is EOS.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowSampling:
    """Per-row sampling settings, (B,) tensors on the engine's device."""

    top_k: torch.Tensor  # int64, >= 1
    top_p: torch.Tensor  # float32; >= 1 disables nucleus filtering
    temperature: torch.Tensor  # float32
    repetition_penalty: torch.Tensor  # float32
    eos_from_step: torch.Tensor  # int64: EOS may be chosen from this step on

    def rows(self, rows: slice | torch.Tensor) -> RowSampling:
        return RowSampling(*(getattr(self, name)[rows] for name in self.__dataclass_fields__))


def penalised_logits(
    logits: torch.Tensor, seen: torch.Tensor, sampling: RowSampling, step: torch.Tensor, eos_id: int
) -> torch.Tensor:
    """(B, V) float32 logits -> the EOS column blocked where too early, seen ids penalised."""
    eos_column = torch.arange(logits.shape[1], device=logits.device) == eos_id  # (V,)
    blocked = eos_column & (step < sampling.eos_from_step).unsqueeze(1)  # (B, V)
    logits = logits.masked_fill(blocked, float("-inf"))
    penalty = sampling.repetition_penalty.unsqueeze(1)  # (B, 1)
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def choose_tokens(
    logits: torch.Tensor,
    seen: torch.Tensor,
    sampling: RowSampling,
    step: torch.Tensor,
    eos_id: int,
    generator: torch.Generator | None,
    greedy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) logits -> (token (B,) int64, stop_by_eos (B,) bool)."""
    scores = penalised_logits(logits, seen, sampling, step, eos_id)  # (B, V)
    best = scores.argmax(dim=1)  # (B,)
    if greedy:
        return best, best == eos_id
    sorted_scores, sorted_ids = torch.sort(scores, dim=1, descending=True)  # (B, V)
    cumulative = torch.softmax(sorted_scores, dim=1).cumsum(dim=1)
    top_p = sampling.top_p.unsqueeze(1)
    remove_sorted = (cumulative > top_p) & (top_p < 1.0)
    remove_sorted[:, 0] = False  # the best id always stays
    remove = torch.zeros_like(remove_sorted).scatter(1, sorted_ids, remove_sorted)
    temperature = sampling.temperature.clamp(min=1e-5).unsqueeze(1)
    tempered = scores.masked_fill(remove, float("-inf")) / temperature  # (B, V)
    # The k-th largest tempered value: nucleus removal takes a tail of the sorted order, so the
    # sorted scores, masked and divided the same way, hold it at column k - 1.
    sorted_tempered = sorted_scores.masked_fill(remove_sorted, float("-inf")) / temperature
    k = sampling.top_k.clamp(1, scores.shape[1]).unsqueeze(1) - 1  # (B, 1)
    pivot = sorted_tempered.gather(1, k)  # (B, 1)
    tempered = tempered.masked_fill(tempered < pivot, float("-inf"))
    probabilities = torch.softmax(tempered, dim=1)
    race = torch.empty_like(probabilities).exponential_(1.0, generator=generator)
    token = (probabilities / race).argmax(dim=1)
    return token, (token == eos_id) | (best == eos_id)
