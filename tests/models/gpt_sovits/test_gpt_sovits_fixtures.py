"""The fixture command (python -m models.gpt_sovits.check_fixtures DIR) on the shared fixtures, and
on a directory it cannot use."""
from pathlib import Path

import pytest

from models.gpt_sovits.check_fixtures import main

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "gpt_sovits_v2"


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"the shared fixtures are not on this machine ({SHARED})")
def test_every_check_passes_on_the_shared_fixtures(capsys):
    assert main([str(SHARED)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if line.startswith("FAIL")]
    passed, total = (int(n) for n in lines[-1].split(" checks passed")[0].split(" of "))
    assert passed == total >= 60


def test_an_empty_directory_fails_in_one_line(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  fixture_directory" in out and "Traceback" not in out
