"""evaluate.gpu_results (the merge docs/results/h200_merged.json comes from) refuses to publish from a
dirty tree before writing anything, and with --allow-dirty writes the merge recorded as dirty.

    python -m pytest -q tests/evaluate/test_gpu_results_publishing.py
"""
from __future__ import annotations

import json
import sys

import pytest
from conftest import run_git

from evaluate import gpu_results


@pytest.fixture
def repo(tmp_path):
    """A checkout with one commit holding docs/results/."""
    root = tmp_path / "checkout"
    (root / "docs" / "results").mkdir(parents=True)
    (root / "docs" / "results" / "old.json").write_text("{}\n")
    run_git(root, "init", "-q")
    run_git(root, "add", ".")
    run_git(root, "commit", "-qm", "first")
    return root


def test_an_entry_point_refuses_before_writing_and_records_dirty_when_allowed(repo, monkeypatch, capsys):
    call = {"machine": {"gpu": "test"}, "utterances": 2, "eval_set": "eval",
            "engines": {"teacher/eager": {"rtf_cuda_b1": 0.01, "rtf_cuda_b16": 0.002,
                                          "latency_first_audio_ms_cuda": 5.0}}}
    inputs = repo / "inputs"
    inputs.mkdir()
    (inputs / "engines.json").write_text(json.dumps(call))
    (inputs / "benchmark.json").write_text(json.dumps({"variants": {"teacher": {"vram_peak_mib": 100.0}}}))
    out = repo / "docs" / "results" / "merged.json"
    argv = ["gpu_results", "--benchmark", str(inputs / "benchmark.json"), "--engines", str(inputs / "engines.json"),
            "--out", str(out)]
    monkeypatch.setattr(gpu_results, "REPO_ROOT", repo)
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as refused:  # the untracked inputs/ folder makes the tree dirty
        gpu_results.main()
    assert refused.value.code == 2 and "inputs/engines.json" in capsys.readouterr().err and not out.exists()

    monkeypatch.setattr(sys, "argv", [*argv, "--allow-dirty"])
    gpu_results.main()
    written = json.loads(out.read_text())
    assert written["provenance"]["dirty"] is True and written["provenance"]["allow_dirty"] is True
    assert written["variants"]["teacher"]["rtf_cuda_b1"] == 0.01 and out.with_suffix(".diff").exists()
