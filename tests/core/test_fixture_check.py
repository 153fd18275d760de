"""The fixture-check runner: relative-to-peak comparisons and the exit status of a run."""
import io

import torch

from core.fixture_check import Check, close_to_peak, error_of_peak, exactly_equal, run_checks


def test_error_is_relative_to_the_reference_peak():
    expected = torch.tensor([10.0, -20.0, 5.0], dtype=torch.float64)
    assert abs(error_of_peak(expected + torch.tensor([0.0, 0.002, 0.0]), expected) - 1e-4) < 1e-9
    assert close_to_peak("a", expected + 0.001, expected).passed
    assert not close_to_peak("a", expected + 0.01, expected).passed
    assert not close_to_peak("a", expected[:2], expected).passed


def test_integer_checks_count_mismatches():
    check = exactly_equal("tokens", torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3]))
    assert not check.passed and "1 of 3" in check.detail


def test_run_checks_exit_status_and_summary():
    out = io.StringIO()
    assert run_checks([Check("a", True, "ok"), Check("b", False, "bad")], out) == 1
    assert out.getvalue().splitlines()[-1] == "1 of 2 checks passed; failed: b"
    assert run_checks([Check("a", True, "ok")], io.StringIO()) == 0
    assert run_checks([], io.StringIO()) == 1


def test_a_broken_directory_is_one_failed_line_not_a_traceback():
    def checks():
        yield Check("a", True, "ok")
        raise FileNotFoundError("cases.pt")

    out = io.StringIO()
    assert run_checks(checks(), out) == 1
    assert "FAIL  fixture_directory: FileNotFoundError: cases.pt" in out.getvalue()
