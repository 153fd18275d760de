"""The main job end to end on the debug preset: the same entry function the CLI calls."""
import json

import mlflow
import pytest

from compress.pipeline import run
from compress.run_config import settings_from_config

pytestmark = pytest.mark.slow  # loads the real voice

REQUIRED_METRICS = {"rtf_cpu_b1", "latency_first_audio_ms", "rss_peak_mib", "params_m", "size_mb",
                    "dnsmos_p808", "dnsmos_ovrl", "dnsmos_sig", "dnsmos_bak"}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from tests.conftest import compose_config

    tmp = tmp_path_factory.mktemp("pipeline")
    resolved = compose_config(tmp, ["+experiment=debug"])
    settings = settings_from_config(resolved)
    return settings, run(settings, resolved)


def test_every_variant_has_the_stable_metric_names(finished_run):
    _, rows = finished_run
    assert set(rows) == {"teacher", "original_onnx"}
    for metrics in rows.values():
        assert REQUIRED_METRICS <= set(metrics)
    assert {"mcd_db", "spk_sim"} <= set(rows["original_onnx"])  # measured against the teacher
    for metrics in rows.values():  # both timed on the CPU: re-timed together in interleaved rounds
        assert metrics["speed_rounds"] == 3 and metrics["rtf_cpu_b1_spread"] >= 0
        assert "rtf_cpu_b1_alone" in metrics


def test_teacher_and_original_onnx_sound_the_same(finished_run):
    """Same noise into both engines: the port should be indistinguishable from the original."""
    _, rows = finished_run
    original = rows["original_onnx"]
    assert original["mcd_db"] < 5e-4  # measured 4.6e-5 dB on the debug preset
    assert original["spk_sim"] > 0.99
    assert abs(original["dnsmos_p808"] - rows["teacher"]["dnsmos_p808"]) < 0.01
    assert rows["teacher"]["params_m"] == pytest.approx(original["params_m"], rel=0.01)


def test_mlflow_store_holds_parent_nested_runs_and_artifacts(finished_run):
    settings, _ = finished_run
    mlflow.set_tracking_uri(settings.tracking.tracking_uri)
    runs = mlflow.search_runs(experiment_names=[settings.tracking.experiment_name], output_format="list")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert parents[0].data.params["data.max_eval_sentences"] == "2"  # flattened resolved config
    assert parents[0].data.tags["git_revision"]
    client = mlflow.MlflowClient()
    parent_files = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"resolved_config.yaml", "results.md", "results.json"} <= parent_files
    for child in children:
        files = {a.path for a in client.list_artifacts(child.info.run_id, "audio")}
        files |= {a.path for a in client.list_artifacts(child.info.run_id, "spectrograms")}
        assert {"audio/sample_00.wav", "spectrograms/sample_00.png"} <= files
        assert REQUIRED_METRICS <= set(child.data.metrics)


def test_run_dir_keeps_config_and_results(finished_run):
    settings, rows = finished_run
    from pathlib import Path

    run_dir = Path(settings.paths.run_dir)
    assert (run_dir / "resolved_config.yaml").is_file()
    assert json.loads((run_dir / "results.json").read_text()) == rows


def test_gpu_results_merge_into_the_variant_rows(tmp_path):
    from tests.conftest import compose_config

    gpu_json = tmp_path / "gpu.json"
    gpu_json.write_text(json.dumps({"machine": {"gpu": "NVIDIA H200"},
                                    "variants": {"teacher": {"rtf_cuda_b1": 0.008, "vram_peak_mib": 202.0}}}))
    resolved = compose_config(tmp_path, ["+experiment=debug", "variants=[teacher]", "evaluate.metrics=[]",
                                         "data.max_eval_sentences=1", f"evaluate.gpu_results={gpu_json}"])
    rows = run(settings_from_config(resolved), resolved)
    assert rows["teacher"]["rtf_cuda_b1"] == 0.008 and rows["teacher"]["vram_peak_mib"] == 202.0


def test_stage_variants_run_through_the_same_pipeline(tmp_path):
    """int8 and pruning on the debug preset: built, scored with the same code, logged with stage tags."""
    from tests.conftest import compose_config

    resolved = compose_config(tmp_path, ["+experiment=debug", "variants=[original_onnx,teacher,int8_ort,pruned]",
                                         "evaluate.metrics=[mcd]", "data.max_eval_sentences=1"])
    rows = run(settings_from_config(resolved), resolved)
    assert set(rows) == {"original_onnx", "teacher", "int8_ort", "pruned"}
    assert rows["pruned"]["params_m"] < rows["teacher"]["params_m"]
    assert rows["int8_ort"]["size_mb"] < rows["original_onnx"]["size_mb"]
    for name in ("int8_ort", "pruned"):
        assert "rtf_cpu_b1" in rows[name] and rows[name]["mcd_db"] > 0
