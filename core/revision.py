"""Where a result came from: the git revision and, for a results file, its full provenance.

    from core.revision import git_revision, provenance
    git_revision(".")   # 'd8316b2...' or 'd8316b2...-dirty' or 'unknown'
    provenance(".")     # {"commit", "dirty", "diff_sha256", "machine", "command", "date_utc"}

A tree that differs from HEAD is recorded as such, with the sha256 of ``git diff HEAD`` (and the
names and content hashes of untracked files), and ``save_diff`` keeps that diff beside the results, so a figure from
uncommitted code still names exactly the code that ran.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path

from core.atomic_io import write_text_atomic
from core.file_digest import file_sha256


def _git(root: str | Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def git_revision(root: str | Path) -> str:
    """HEAD's hash at ``root``, with ``-dirty`` when the working tree differs from it, ``unknown``
    outside a git checkout. Why the flag: a tree copied onto another machine may carry an older
    ``.git`` than its files, and a clean-looking hash would then name code that did not run."""
    try:
        revision, status = _git(root, "rev-parse", "HEAD"), _git(root, "status", "--porcelain")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return revision.strip() + ("-dirty" if status.strip() else "")


def working_tree_diff(root: str | Path) -> str:
    """``git diff HEAD`` plus each untracked, unignored file with the sha256 of its bytes: what HEAD
    alone does not hold. The content hash matters: two trees whose new files differ only inside
    would otherwise record the same diff."""
    diff = _git(root, "diff", "HEAD", "--binary")
    untracked = _git(root, "ls-files", "--others", "--exclude-standard").splitlines()
    lines = [f"untracked: {name} sha256={_file_sha256(Path(root) / name)}\n" for name in untracked]
    return diff + "".join(lines)


def _file_sha256(path: Path) -> str:
    try:
        return file_sha256(path)
    except OSError:  # removed between the listing and the read
        return "unreadable"


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), or what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def code_tree_identity(root: str | Path, pathspecs: tuple[str, ...]) -> str | None:
    """sha256 of HEAD's file listing (paths and blob hashes) under ``pathspecs`` (git pathspecs, so
    ``:(exclude)models/checkpoints`` works); None when anything there differs from HEAD (uncommitted
    or untracked files) or ``root`` is no git checkout. Commits that touch none of those paths (docs,
    results) keep the identity, so work done under it stays reusable across them."""
    try:
        if _git(root, "status", "--porcelain", "--untracked-files=all", "--", *pathspecs).strip():
            return None
        # With no difference from HEAD there, the index lists HEAD's blobs (ls-tree takes no exclusions).
        listing = _git(root, "ls-files", "--stage", "--", *pathspecs)
    except (OSError, subprocess.CalledProcessError):
        return None
    return hashlib.sha256(listing.encode("utf-8")).hexdigest() if listing else None


def provenance(root: str | Path, command: list[str] | None = None) -> dict:
    """Commit, dirty flag and diff hash, machine, command and UTC date for a results file."""
    try:
        commit = _git(root, "rev-parse", "HEAD").strip()
        diff = working_tree_diff(root)
    except (OSError, subprocess.CalledProcessError):
        commit, diff = "unknown", ""
    return {
        "commit": commit,
        "dirty": bool(diff),
        "diff_sha256": hashlib.sha256(diff.encode("utf-8")).hexdigest() if diff else None,
        "machine": {"platform": platform.platform(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version()},
        "command": " ".join(command if command is not None else [Path(sys.executable).name, *sys.argv]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def save_diff(root: str | Path, results_path: str | Path) -> Path | None:
    """Keep the working tree's diff beside ``results_path`` (``<name>.diff``) when the tree is dirty."""
    try:
        diff = working_tree_diff(root)
    except (OSError, subprocess.CalledProcessError):
        return None
    if not diff:
        return None
    path = Path(results_path).with_suffix(".diff")
    write_text_atomic(path, diff)
    return path
