"""Check a GPT-SoVITS v2 port against reference outputs of the official code.

    python -m models.gpt_sovits.check_fixtures ../shared/fixtures/gpt_sovits_v2

DIR holds a GPT checkpoint (``*.ckpt``), a SoVITS checkpoint (``*.pth``), ``cases.pt`` and
``cases_meta.json`` in the format of the shared fixtures; their sizes come from the files' own
configs. Prints one line per check and a summary; exits 1 when any check fails.
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Iterator

import torch

from core.fixture_check import Check, run_checks
from models.gpt_sovits.fixture_checks_sovits import sovits_checks
from models.gpt_sovits.fixture_checks_t2s import t2s_checks


def fixture_checks(fixture_dir: Path) -> Iterator[Check]:
    """Every text-to-semantic check, then every SoVITS and quantizer check, of ``fixture_dir``."""
    return itertools.chain(t2s_checks(fixture_dir), sovits_checks(fixture_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixture_dir", type=Path)
    args = parser.parse_args(argv)
    if not args.fixture_dir.is_dir():
        parser.error(f"{args.fixture_dir} is not a directory")
    torch.set_num_threads(1)
    return run_checks(fixture_checks(args.fixture_dir))


if __name__ == "__main__":
    raise SystemExit(main())
