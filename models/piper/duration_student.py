"""A duration predictor for the Lite student that costs a fraction of the teacher's stochastic one.

Piper's stochastic duration predictor turns noise into log-durations through three spline coupling
layers, each with its own three-layer convolution stack: 549 of the Lite student's graph nodes, 14 %
of its kernel time in onnxruntime's profiler, but only about 5 % of its wall time (docs/benchmarks.md:
the profiler's cost per node inflates scopes of many small nodes). This module
keeps the predictor's conditioning trunk (its ``pre``, ``convs``, ``proj`` and speaker ``cond``,
initialised from the teacher's) and replaces the flows by their first-order form in the noise:

    log_w = mean(h) + slope_0(h) * noise_0 + slope_1(h) * noise_1,    h = trunk(text encoding)

fitted to the teacher's log-durations on the same noise (models/piper/training/duration_training.py).
It takes the teacher's call signature, noise included, so a graph feeds it exactly what it fed the
teacher and ``noise_scale_w`` keeps its meaning. One head serves every noise scale, so it is closest
to the teacher near the scale it is used at (its card: 3.7 % length error at 0.8, 7.7 % at zero noise).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from core.atomic_io import atomic_write
from models.piper.vits import DurationConditioning, StochasticDurationPredictor, VitsHyperParams

NOISE_CHANNELS = 2  # the teacher's duration noise is (B, 2, T_text)
DURATION_STUDENT_KIND = "noise_affine_duration_predictor"


class NoiseAffineDurationPredictor(DurationConditioning):
    """(B, C, T_text) text encoding, (B, 2, T_text) pre-scaled noise -> (B, 1, T_text) log-durations."""

    def __init__(self, hp: VitsHyperParams):
        super().__init__(hp)
        self.head = nn.Conv1d(hp.dp_filter_channels, 1 + NOISE_CHANNELS, 1)  # mean and one slope per noise channel

    @classmethod
    def from_teacher(cls, hp: VitsHyperParams, teacher: StochasticDurationPredictor) -> "NoiseAffineDurationPredictor":
        """A student whose trunk starts as the teacher's (the head starts at zero: log_w = 0)."""
        student = cls(hp)
        trunk = {name: tensor for name, tensor in teacher.state_dict().items()
                 if name.split(".", 1)[0] in ("pre", "convs", "proj", "cond")}
        missing = student.load_state_dict(trunk, strict=False).missing_keys
        if sorted(missing) != ["head.bias", "head.weight"]:
            raise ValueError(f"the teacher's duration predictor lacks trunk weights: {sorted(missing)}")
        nn.init.zeros_(student.head.weight)
        nn.init.zeros_(student.head.bias)
        return student

    def forward(self, x: torch.Tensor, mask: torch.Tensor, noise: torch.Tensor,
                g: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, C, T); mask: (B, 1, T); noise: (B, 2, T) already scaled by noise_scale_w."""
        out = self.head(self.conditioning(x, mask, g))  # (B, 3, T)
        return (out[:, :1] + (out[:, 1:] * noise).sum(dim=1, keepdim=True)) * mask  # (B, 1, T)


def save_duration_student(student: NoiseAffineDurationPredictor, path: Path, card: dict) -> None:
    """Weights plus the card (how it was trained and measured) as safetensors metadata."""
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in student.state_dict().items()}
    metadata = {"kind": DURATION_STUDENT_KIND, "card": json.dumps(card)}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata=metadata))


def load_duration_student(hp: VitsHyperParams, path: Path) -> NoiseAffineDurationPredictor:
    """The student saved at ``path``, for a voice with ``hp``; refuses other files."""
    with safe_open(str(path), framework="pt") as handle:
        kind = (handle.metadata() or {}).get("kind")
    if kind != DURATION_STUDENT_KIND:
        raise ValueError(f"{path}: metadata kind {kind!r}, expected {DURATION_STUDENT_KIND!r}")
    student = NoiseAffineDurationPredictor(hp)
    student.load_state_dict(load_file(str(path)), strict=True)
    return student.eval()


def duration_student_card(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as handle:
        return json.loads((handle.metadata() or {})["card"])
