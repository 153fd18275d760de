"""Reference-fixture checks shared by every family's ``check_fixtures`` command.

A family's checks are a generator of ``Check`` results; ``run_checks`` prints one line per check
and a summary line, and returns the process exit status (0 only when every check passed):

    python -m models.<family>.check_fixtures ../shared/fixtures/<family_dir>

Floats are compared relative to the reference's peak, because fixture outputs range from logits
of order 10 to waveforms of order 1e-2 and one absolute tolerance fits neither.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Iterable, TextIO

import torch


@dataclass(frozen=True)
class Check:
    name: str  # "case0/greedy_tokens"
    passed: bool
    detail: str  # the measured figure and the bound it was held to

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name}: {self.detail}"


def error_of_peak(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (absolute when the reference is all zeros);
    infinity when the shapes differ."""
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    if actual.shape != expected.shape:
        return float("inf")
    if expected.numel() == 0:
        return 0.0
    peak = float(expected.abs().max())
    error = float((actual - expected).abs().max())
    return error / peak if peak > 0 else error


def close_to_peak(name: str, actual: torch.Tensor, expected: torch.Tensor, tolerance: float = 1e-4) -> Check:
    """A float check: error relative to the reference's peak within ``tolerance``."""
    if tuple(actual.shape) != tuple(expected.shape):
        return Check(name, False, f"shape {tuple(actual.shape)} != reference {tuple(expected.shape)}")
    error = error_of_peak(actual, expected)
    return Check(name, error <= tolerance, f"max error {error:.2e} of peak (bound {tolerance:.0e})")


def exactly_equal(name: str, actual: torch.Tensor, expected: torch.Tensor) -> Check:
    """An integer check (tokens, codes, durations): every entry equal."""
    if tuple(actual.shape) != tuple(expected.shape):
        return Check(name, False, f"shape {tuple(actual.shape)} != reference {tuple(expected.shape)}")
    mismatches = int((actual.cpu().long() != expected.cpu().long()).sum())
    return Check(name, mismatches == 0, f"{mismatches} of {expected.numel()} entries differ")


def run_checks(checks: Iterable[Check], stream: TextIO | None = None) -> int:
    """Print each check as it completes and a summary; 0 when all passed, 1 otherwise. A check
    generator that raises counts as a failure named after the exception, not a traceback."""
    stream = stream or sys.stdout
    results: list[Check] = []
    try:
        for check in checks:
            results.append(check)
            print(check.line(), file=stream, flush=True)
    except Exception as error:  # a broken fixture directory is a failed check, reported in one line
        failure = Check("fixture_directory", False, f"{type(error).__name__}: {error}")
        results.append(failure)
        print(failure.line(), file=stream, flush=True)
    failed = [check.name for check in results if not check.passed]
    summary = f"{len(results) - len(failed)} of {len(results)} checks passed"
    print(summary + (f"; failed: {', '.join(failed)}" if failed else ""), file=stream, flush=True)
    return 1 if failed or not results else 0
