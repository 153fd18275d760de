"""Publishing a finished run (compress/publish_run.py): its rows, its champion, other rules' champions
on the same rows, and the provenance its MLflow parent run recorded.

    python -m pytest -q tests/compress/test_publish_run.py
"""
from __future__ import annotations

import json
from datetime import datetime

import mlflow
import pytest
import yaml

from compress.publish_run import RUN_DIR_STAMP, main

# A fast variant that sounds like another speaker, and a slower one that keeps the teacher's voice.
ROWS = {
    "teacher": {"rtf_cpu_b1": 0.080, "dnsmos_p808": 3.90, "wer": 0.010, "size_mb": 60.0},
    "fast": {"rtf_cpu_b1": 0.020, "dnsmos_p808": 3.86, "wer": 0.010, "spk_sim": 0.93, "mcd_db": 1.30,
             "size_mb": 20.0},
    "faithful": {"rtf_cpu_b1": 0.040, "dnsmos_p808": 3.88, "wer": 0.012, "spk_sim": 0.97, "mcd_db": 0.60,
                 "size_mb": 30.0},
}


@pytest.fixture
def finished_run(tmp_path):
    """A run directory as `python -m compress` leaves it, and its MLflow parent run."""
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("tts-compress")
    with mlflow.start_run() as run:
        mlflow.set_tags({"git_revision": "0123abc", "git_diff_sha256": "clean", "machine_cpu": "Test CPU",
                         "command": "python -m compress +experiment=full data=harvard"})
    run_dir = tmp_path / "runs" / datetime.fromtimestamp(run.info.start_time / 1000).strftime(RUN_DIR_STAMP)
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps(ROWS))
    eligibility = {name: {"eligible": True, "reasons": []} for name in ROWS}
    (run_dir / "selection.json").write_text(json.dumps({"champion": "fast", "rule": "the run's rule",
                                                        "eligibility": eligibility, "rows": ROWS}))
    resolved = {"tracking": {"tracking_uri": tracking_uri, "experiment_name": "tts-compress"},
                "model": {"family": "piper", "voice": "en_US-joe-medium", "language": "en"},
                "data": {"eval_set": "harvard", "max_eval_sentences": None},
                "variants": list(ROWS), "evaluate": {"reference_variant": "teacher", "warm_runs": 3}}
    (run_dir / "resolved_config.yaml").write_text(yaml.safe_dump(resolved))
    return run_dir, run.info.run_id


def test_publishes_rows_champions_and_the_runs_provenance(finished_run, tmp_path, capsys):
    run_dir, run_id = finished_run
    out = tmp_path / "published.json"
    main(["--run-dir", str(run_dir), "--out", str(out), "--also-selection", "cpu"])
    report = json.loads(out.read_text())
    assert report["rows"] == ROWS
    assert report["selection"]["champion"] == "fast" and "rows" not in report["selection"]
    # The CPU rule wants the teacher's speaker (spk_sim >= 0.95) and spectrum (MCD <= 1 dB).
    cpu = report["also_selected"]["cpu"]
    assert cpu["champion"] == "faithful"
    assert any("spk_sim" in reason for reason in cpu["eligibility"]["fast"]["reasons"])
    assert report["run"]["mlflow_run_id"] == run_id
    assert report["run"]["git_revision"] == "0123abc" and report["run"]["eval_set"] == "harvard"
    # The summary for docs/benchmarks.md: one line per variant, each rule's verdict in its own column.
    summary = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines()}
    assert summary["faithful"].endswith("| eligible | **champion** |")
    assert summary["fast"].split(" | ")[-2] == "**champion**"


def test_a_run_that_did_not_finish_is_refused(finished_run, tmp_path, capsys):
    run_dir, _ = finished_run
    (run_dir / "results.json").unlink()
    with pytest.raises(SystemExit) as stopped:
        main(["--run-dir", str(run_dir), "--out", str(tmp_path / "published.json")])
    assert stopped.value.code == 2
    assert "results.json" in capsys.readouterr().err


def test_a_directory_not_named_by_its_start_time_is_refused(tmp_path):
    from compress.publish_run import parent_run_tags

    with pytest.raises(SystemExit, match="not a run directory's name"):
        parent_run_tags(f"sqlite:///{tmp_path / 'mlflow.db'}", "tts-compress", tmp_path / "0")
