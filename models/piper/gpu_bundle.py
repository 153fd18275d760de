"""Piper's variants and CUDA engines as evaluate.gpu_engines compares them, rebuilt on a GPU machine
from a distillation bundle with torch + safetensors alone (no ONNX import, no espeak-ng there).

A bundle is the folder ``python -m compress.distil prepare --family <family>`` writes: ``bundle.json`` (the
teacher's hyperparameters, its sample rate, the family) and ``teacher.safetensors`` (its weights,
float16 to travel light). The variants:

* ``teacher``: the FP32 PyTorch port, weights back in float32;
* ``fp16``: the teacher in float16 except the parts that set durations (``HALF_KEEP_FP32``);
* ``lite``, ``lite_fp16``: the teacher with the Lite student's flow and decoder (models/piper/lite.py),
  in float32 and as ``fp16`` builds it; only with a Lite student among the students given;
* ``lite_dur_fp16``: ``lite_fp16`` with the distilled duration predictor (models/piper/duration_student.py)
  in place of the stochastic one, the encoder in float16 too, and the flow's and decoder's convolutions
  channels-last; only with both students. Why each (scripts/profile_piper_engine_stages.py on the H200,
  docs/benchmarks.md): at batch 16 the FP32 text stage was half of the student's time, the spline
  flows a fifth of it, and channels-last made the acoustic stage 1.46x faster but the encoder slower.
  The distilled predictor, kept in float32, reads the float16 encoder's output cast back to float32.

The engines are models/piper/engines.py's: ``eager`` (the model's forward), ``cuda_graphs``
(static shape buckets captured as CUDA graphs), ``compile`` (torch.compile) and ``aoti``
(AOTInductor packages).
"""
from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from models.conv_layout import convert_convs
from models.piper.duration_student import DURATION_STUDENT_KIND, load_duration_student
from models.piper.engines import BucketedEngine, EagerEngine, StageBackend
from models.piper.lite import LITE_CONFIG_METADATA_KEY, STUDENT_PARTS, load_student
from models.piper.vits import PiperVits, hyperparams_from_dict
from models.precision import to_half_precision

# (variant, backend) in the order they run: the eager references first (every later engine's SNR
# is against its variant's eager run), then the Lite FP16 and teacher candidates, then the rest.
ENGINE_PLAN = (("teacher", "eager"), ("lite_fp16", "eager"), ("lite", "eager"), ("fp16", "eager"),
               ("lite_dur_fp16", "eager"), ("teacher", "cuda_graphs"), ("lite_fp16", "cuda_graphs"),
               ("lite_dur_fp16", "cuda_graphs"), ("lite", "cuda_graphs"), ("fp16", "cuda_graphs"), ("lite_fp16", "compile"), ("lite_dur_fp16", "compile"),
               ("lite_fp16", "aoti"), ("teacher", "compile"),
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


def student_kind(weights_path: Path) -> str:
    """Which student a safetensors file holds, by its metadata: ``"acoustic"`` (a Lite flow and
    decoder) or ``"duration"`` (a distilled duration predictor); anything else is a ValueError."""
    with safe_open(str(weights_path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if LITE_CONFIG_METADATA_KEY in metadata:
        return "acoustic"
    if metadata.get("kind") == DURATION_STUDENT_KIND:
        return "duration"
    raise ValueError(f"{weights_path}: neither a Lite student (metadata {LITE_CONFIG_METADATA_KEY!r}) nor a "
                     f"duration student (metadata kind {DURATION_STUDENT_KIND!r})")


def engine_variants(bundle_dir: Path, student_weights: Sequence[Path] = ()) -> dict[str, Callable[[], nn.Module]]:
    """Variant name -> a function giving that variant on the CPU (half variants are fresh copies).

    ``student_weights``: distilled students' safetensors, at most one of each kind (``student_kind``);
    the variants that need a student missing here are left out.
    """
    teacher = teacher_from_bundle(bundle_dir)
    students: dict[str, Path] = {}
    for path in map(Path, student_weights):
        kind = student_kind(path)
        if kind in students:
            raise ValueError(f"two {kind} students given: {students[kind]} and {path}")
        students[kind] = path

    def half(model: nn.Module, keep_fp32: Sequence[str] = HALF_KEEP_FP32) -> nn.Module:
        return to_half_precision(model, torch.float16, keep_fp32=keep_fp32)

    variants = {"teacher": lambda: teacher, "fp16": lambda: half(teacher)}
    if "acoustic" in students:
        lite = copy.deepcopy(teacher)
        parts, _ = load_student(teacher.hp, students["acoustic"])
        for role in STUDENT_PARTS:
            lite.replace_part(role, parts[role])
        variants.update(lite=lambda: lite, lite_fp16=lambda: half(lite))
        if "duration" in students:
            def lite_dur_fp16() -> nn.Module:
                model = copy.deepcopy(lite)
                model.replace_part("duration", load_duration_student(teacher.hp, students["duration"]))
                model = half(model, keep_fp32=("duration",))
                for role in STUDENT_PARTS:
                    convert_convs(model.parts()[role], "channels_last")
                return model

            variants["lite_dur_fp16"] = lite_dur_fp16
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
