"""The code a result came from: the git revision stored beside MLflow runs and load-test reports.

    from core.revision import git_revision
    git_revision(".")   # 'd8316b2...' or 'd8316b2...-dirty' or 'unknown'
"""
from __future__ import annotations

import subprocess
from pathlib import Path


def git_revision(root: str | Path) -> str:
    """HEAD's hash at ``root``, with ``-dirty`` when the working tree differs from it, ``unknown``
    outside a git checkout. Why the flag: a tree copied onto another machine may carry an older
    ``.git`` than its files, and a clean-looking hash would then name code that did not run."""
    try:
        revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return revision.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
