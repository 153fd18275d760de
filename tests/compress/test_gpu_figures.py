"""A variant's GPU figures join its row only when the GPU call ran the weights the run scored
(compress/pipeline.py ``_gpu_figures_of``): a Lite row never shows another student's timing."""
from __future__ import annotations

from pathlib import Path

from compress.pipeline import _gpu_figures_of
from compress.variants import Variant
from core.file_digest import file_sha256
from evaluate.gpu_results import VARIANT_STUDENTS_KEY

FIGURES = {"rtf_cuda_b1": 0.006, "rtf_cuda_b16": 0.0006}


def _variant(name: str, trained_weights: tuple[Path, ...] = ()) -> Variant:
    return Variant(name, model=None, engine="torch", device="cpu", params_m=1.0, size_mb=1.0,
                   trained_weights=trained_weights)


def _gpu(students: dict[str, list[str]] | None) -> dict:
    gpu = {"machine": {"gpu": "NVIDIA H200"}, "variants": {"lite": FIGURES, "teacher": FIGURES}}
    return gpu if students is None else gpu | {VARIANT_STUDENTS_KEY: students}


def test_figures_join_when_the_call_ran_the_same_weights(tmp_path):
    student = tmp_path / "student.safetensors"
    student.write_bytes(b"the student the run scored")
    digests: dict[Path, str] = {}
    assert _gpu_figures_of(_gpu({"lite": [file_sha256(student)]}), _variant("lite", (student,)), digests) == FIGURES
    assert digests == {student: file_sha256(student)}  # hashed once, kept for the run's other uses


def test_figures_are_withheld_for_other_or_unrecorded_weights(tmp_path, capsys):
    student = tmp_path / "student.safetensors"
    student.write_bytes(b"the student the run scored")
    lite = _variant("lite", (student,))
    assert _gpu_figures_of(_gpu({"lite": ["0" * 64]}), lite, {}) is None
    assert "GPU figures withheld" in capsys.readouterr().out
    assert _gpu_figures_of(_gpu(None), lite, {}) is None  # a results file from before digests were recorded


def test_variants_without_trained_weights_take_their_figures_as_before():
    assert _gpu_figures_of(_gpu(None), _variant("teacher"), {}) == FIGURES
    assert _gpu_figures_of(_gpu(None), _variant("fp16"), {}) == {}  # none measured
