"""Piper's variants and CUDA engines as evaluate.gpu_engines compares them, rebuilt on a GPU machine
from a distillation bundle with torch + safetensors alone (no ONNX import, no espeak-ng there).

A bundle is the folder ``python -m compress.distil prepare --family <family>`` writes: ``bundle.json`` (the
teacher's hyperparameters, its sample rate, the family) and ``teacher.safetensors`` (its weights,
float16 to travel light). The variants:

* ``teacher``: the FP32 PyTorch port, weights back in float32;
* ``fp16``: the teacher in float16 except the parts that set durations (``HALF_KEEP_FP32``);
* ``lite``, ``lite_fp16``: the teacher with the Lite student's flow and decoder (models/piper/lite.py),
  in float32 and as ``fp16`` builds it; only with ``student_weights``.

The engines are models/piper/engines.py's: ``eager`` (the model's forward), ``cuda_graphs``
(static shape buckets captured as CUDA graphs), ``compile`` (torch.compile) and ``aoti``
(AOTInductor packages).
"""
from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from models.piper.engines import BucketedEngine, EagerEngine, StageBackend
from models.piper.lite import STUDENT_PARTS, load_student
from models.piper.vits import PiperVits, hyperparams_from_dict
from models.precision import to_half_precision

# (variant, backend) in the order they run: the eager references first (every later engine's SNR
# is against its variant's eager run), then the Lite FP16 and teacher candidates, then the rest.
ENGINE_PLAN = (("teacher", "eager"), ("lite_fp16", "eager"), ("lite", "eager"), ("fp16", "eager"),
               ("teacher", "cuda_graphs"), ("lite_fp16", "cuda_graphs"), ("lite", "cuda_graphs"),
               ("fp16", "cuda_graphs"), ("lite_fp16", "compile"), ("lite_fp16", "aoti"), ("teacher", "compile"),
               ("teacher", "aoti"), ("lite", "compile"), ("lite", "aoti"), ("fp16", "compile"), ("fp16", "aoti"))
# Per backend, the runs of one built engine: without CUDA graphs (False) and through them (True).
# cuda_graphs: the bucketed engine without graphs is eager with padding, so only the graphed run counts.
# aoti: the AOTInductor runner cannot be captured ("operation not permitted when stream is
# capturing"), and a failed capture poisons the CUDA context for every later engine.
GRAPH_MODES = {"eager": (False,), "cuda_graphs": (True,), "compile": (False, True), "aoti": (False,)}
# Alone in half precision these change phoneme durations (the ceil() after them flips);
# the flow and the decoder, which hold most of the compute, do not.
HALF_KEEP_FP32 = ("encoder", "duration")


def teacher_from_bundle(bundle_dir: Path) -> PiperVits:
    """The FP32 teacher from a bundle's hyperparameters and weights, on the CPU, in eval mode."""
    bundle = json.loads((Path(bundle_dir) / "bundle.json").read_text(encoding="utf-8"))
    teacher = PiperVits(hyperparams_from_dict(bundle["hyperparams"]))
    weights = load_file(str(Path(bundle_dir) / "teacher.safetensors"))
    teacher.load_state_dict({name: tensor.float() for name, tensor in weights.items()}, strict=True)
    return teacher.eval()


def engine_variants(bundle_dir: Path, student_weights: Path | None) -> dict[str, Callable[[], nn.Module]]:
    """Variant name -> a function giving that variant on the CPU (half variants are fresh copies).

    ``student_weights``: the Lite student's safetensors; None leaves the ``lite`` variants out.
    """
    teacher = teacher_from_bundle(bundle_dir)

    def half(model: nn.Module) -> nn.Module:
        return to_half_precision(model, torch.float16, keep_fp32=HALF_KEEP_FP32)

    variants = {"teacher": lambda: teacher, "fp16": lambda: half(teacher)}
    if student_weights is not None:
        lite = copy.deepcopy(teacher)
        parts, _ = load_student(teacher.hp, Path(student_weights))
        for role in STUDENT_PARTS:
            lite.replace_part(role, parts[role])
        variants.update(lite=lambda: lite, lite_fp16=lambda: half(lite))
    return variants


def build_engine(model: nn.Module, backend: str, sample_rate_hz: int, package_dir: Path):
    """An engine with ``synthesize(request)`` for ``model`` (already on its device).

    Bucketed engines also have ``use_graphs(bool)`` and ``compile_s``; AOTInductor packages go
    under ``package_dir``.
    """
    if backend not in GRAPH_MODES:
        raise ValueError(f"engine backend {backend!r}: accepted {sorted(GRAPH_MODES)}")
    if backend == "eager":
        return EagerEngine(model, sample_rate_hz)
    kind = "eager" if backend == "cuda_graphs" else backend  # cuda_graphs: eager stages, captured
    return BucketedEngine(model, sample_rate_hz, graphs=False, backend=StageBackend(kind, package_dir=os.fspath(package_dir)))
