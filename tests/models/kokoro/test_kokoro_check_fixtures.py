"""Kokoro against the official code's reference cases (../shared/fixtures/kokoro/tiny), through the
same generator ``python -m models.kokoro.check_fixtures DIR`` runs."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from core.fixture_check import run_checks
from models.kokoro.check_fixtures import fixture_checks, main

TINY_FIXTURES = Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "kokoro" / "tiny"
pytestmark = pytest.mark.skipif(not TINY_FIXTURES.is_dir(), reason=f"shared fixtures absent: {TINY_FIXTURES}")


def test_every_fixture_check_passes():
    torch.set_num_threads(1)
    checks = list(fixture_checks(TINY_FIXTURES))
    failed = [check.line() for check in checks if not check.passed]
    assert not failed, "\n".join(failed)
    assert len(checks) >= 100  # 14 cases, every intermediate boundary of the end-to-end ones
    names = {check.name for check in checks}
    assert "forward_with_tokens__speed1.3__TorchSTFT__captured_noise/pred_dur" in names
    assert "decoder_fixed_inputs__CustomSTFT__captured_noise/audio" in names


def test_a_directory_without_cases_fails_with_one_line(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  fixture_directory" in out and "0 of 1 checks passed" in out


def test_a_wrong_reference_is_reported(tmp_path):
    """A case whose reference durations were altered fails on exactly that check."""
    fixtures = torch.load(TINY_FIXTURES / "cases.pt", map_location="cpu", weights_only=True)
    case = fixtures["cases"]["forward_with_tokens__speed1.0__TorchSTFT__noise_off"]
    fixtures["cases"] = {"forward_with_tokens__speed1.0__TorchSTFT__noise_off": case}
    case["outputs"]["pred_dur"] = case["outputs"]["pred_dur"] + 1
    torch.save(fixtures, tmp_path / "cases.pt")
    for name in ("kokoro_tiny.pth", "tiny_config.json"):
        (tmp_path / name).symlink_to(TINY_FIXTURES / name)
    stream = io.StringIO()
    assert run_checks(fixture_checks(tmp_path), stream) == 1
    failed = [line for line in stream.getvalue().splitlines() if line.startswith("FAIL")]
    assert failed == ["FAIL  forward_with_tokens__speed1.0__TorchSTFT__noise_off/pred_dur: 32 of 32 entries differ"]
