"""A variant's GPU figures join its row only when the GPU call ran the weights the run scored
(compress/pipeline.py ``_gpu_figures_of``): a Lite row never shows another student's timing; and an
engine run carries quality only where the run measured it at that engine's precision."""
from __future__ import annotations

from pathlib import Path

import mlflow

from compress.pipeline import _gpu_figures_of, _log_engine_runs
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


def test_engine_runs_carry_quality_only_at_their_variants_precision(tmp_path):
    """``lite_fp16`` engines run the Lite weights in half precision: the FP32 Lite row's quality was not
    measured on their audio, so their nested runs log speed only; withheld variants log nothing."""
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("engines")
    gpu = {"machine": {"gpu": "NVIDIA H200"},
           "engines": {"lite/eager": {"rtf_cuda_b1": 0.006}, "lite_fp16/compile": {"rtf_cuda_b1": 0.002},
                       "teacher/eager": {"rtf_cuda_b1": 0.008}}}
    rows = {"lite": {"dnsmos_p808": 3.6, "rtf_cpu_b1": 0.02}}  # teacher: withheld, so not among the rows
    with mlflow.start_run() as parent:
        _log_engine_runs(gpu, rows)
    client = mlflow.tracking.MlflowClient()
    children = {run.data.tags["mlflow.runName"]: run for run in
                client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}
    assert set(children) == {"lite@eager", "lite_fp16@compile"}
    assert children["lite@eager"].data.metrics == {"dnsmos_p808": 3.6, "rtf_cuda_b1": 0.006}
    assert children["lite_fp16@compile"].data.metrics == {"rtf_cuda_b1": 0.002}
    assert children["lite_fp16@compile"].data.tags["quality"] == "not measured in this run"
