"""scripts/profile_onnx_scopes.py on the bundled voice's own graph: onnxruntime's kernel times,
summed by module scope, account for every profiled node and no more time than the runs took."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.profile_onnx_scopes import scope_of

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_scopes_cover_the_graph_and_fit_in_wall_time(tmp_path):
    out = tmp_path / "profile.json"
    subprocess.run([sys.executable, "scripts/profile_onnx_scopes.py", "--family", "piper", "--count", "1",
                    "--repeats", "2", "--depth", "1", "--out", str(out)], cwd=REPO_ROOT, check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    report = json.loads(out.read_text())
    scopes = report["by_scope"]
    # The VITS graph's parts by their top scope: text encoder, duration predictor, flow, decoder.
    assert {"enc_p", "dp", "flow", "dec"} <= set(scopes)
    # The same events summed two ways, by scope within scope and by op type over the graph.
    for row in scopes.values():
        assert sum(row["ms_per_run_by_op_type"].values()) == pytest.approx(row["ms_per_run"])
    assert sum(report["by_op_type_ms_per_run"].values()) == pytest.approx(report["kernel_ms_per_run"])
    assert 0 < report["kernel_ms_per_run"] <= report["wall_ms_per_run"]
    # The HiFi-GAN decoder is most of this voice's arithmetic (measured: 58 % of kernel time).
    assert scopes["dec"]["share"] > 0.3 and scopes["dec"]["ms_per_run"] > scopes["enc_p"]["ms_per_run"]
    assert scopes["dec"]["ms_per_run_by_op_type"].get("Conv", 0) > 0
    assert report["provenance"]["commit"]


def test_a_scope_is_the_leading_names_of_a_node():
    assert scope_of("/enc_p/encoder/attn_layers.0/MatMul", 1) == "enc_p"
    assert scope_of("/enc_p/encoder/attn_layers.0/MatMul", 2) == "enc_p/encoder"
    assert scope_of("/Add_3", 1) == "(top level)"
    assert scope_of("/dec/Conv", 2) == "dec"
