"""EmotiVoice port against the official code's fixtures, through the same checks as the command

    python -m models.emotivoice.check_fixtures ../shared/fixtures/emotivoice
"""
from __future__ import annotations

from pathlib import Path

import pytest

from models.emotivoice.check_fixtures import generator_checks, main, manifest_checks, style_checks

FIXTURES = Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "emotivoice"
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"shared fixtures {FIXTURES} absent")


def _failed(checks) -> list[str]:
    return [check.line() for check in checks if not check.passed]


def test_generator_matches_official_for_both_weight_norm_namings():
    checks = list(generator_checks(FIXTURES))
    assert not _failed(checks)
    labels = {check.name.split("/")[0] for check in checks}
    assert labels == {"tiny_g", "tiny_g_parametrizations"}
    durations = [check for check in checks if check.name.endswith("log_duration_predictions")]
    assert len(durations) == 2 * 4  # case0, case1, case2 and the batch, for each file


def test_style_encoder_matches_official():
    checks = list(style_checks(FIXTURES))
    assert checks and not _failed(checks)


@pytest.mark.slow  # builds the full-size generator and style encoder (150 M random parameters)
def test_full_size_manifests_load_without_missing_or_unexpected_keys():
    checks = list(manifest_checks(FIXTURES))
    assert len(checks) == 4 and not _failed(checks)


def test_command_exits_nonzero_on_a_broken_directory(tmp_path):
    assert main([str(tmp_path)]) == 1  # an empty directory: one failed check naming the missing config
