"""Publishing a results file: a figure under docs/ must trace to a commit, so a dirty tree is refused.

    parser.add_argument("--out", required=True)
    add_allow_dirty_argument(parser)                                   # --allow-dirty
    args = parser.parse_args()
    origin = publication_provenance(REPO_ROOT, args.out, args.allow_dirty)   # at start, before any work
    ...
    report["provenance"] = origin                                      # the tree the run started from

A results file is published when it lies under docs/results/ or is docs/benchmarks.md. Publishing
from a tree that differs from HEAD (modified or untracked files), or from outside a git checkout,
raises ``UnpublishableTreeError`` naming the files, before the run spends its time. ``--allow-dirty``
publishes anyway: the provenance then says ``dirty: true`` and ``allow_dirty: true``, and the diff
is kept beside the file (``<name>.diff``, core.revision.save_diff). Files written elsewhere
(outputs/, a GPU machine's $OUT) get the same provenance and are never refused.

Why at start: the run's own outputs (audio beside the JSON) would make the tree look dirty at the
end, and the code that ran is the code the run started with.
"""
from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from core.atomic_io import write_text_atomic
from core.revision import provenance, save_diff

PUBLISHED_DIRS = ("docs/results",)  # relative to the repository root
PUBLISHED_FILES = ("docs/benchmarks.md",)
DIRTY_FILES_SHOWN = 20  # the error lists this many changed files, then a count of the rest


class UnpublishableTreeError(RuntimeError):
    """A published results file would name code that no commit holds."""


def is_published(path: str | Path | None, root: str | Path) -> bool:
    """Whether ``path`` (relative to the working directory, or absolute) is a file docs/ publishes;
    None (a run that writes no file) is not."""
    if path is None:
        return False
    root = Path(root).resolve()
    target = Path(path).resolve()
    return (any(target.is_relative_to(root / folder) for folder in PUBLISHED_DIRS)
            or any(target == root / name for name in PUBLISHED_FILES))


def changed_files(root: str | Path) -> list[str]:
    """Paths that differ from HEAD, as ``git status --porcelain`` names them (untracked ones included)."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root,
                            capture_output=True, text=True, check=True).stdout
    return [line[3:] for line in status.splitlines() if line.strip()]


def publication_provenance(root: str | Path, out: str | Path | None, allow_dirty: bool = False,
                           command: list[str] | None = None) -> dict:
    """core.revision.provenance of ``root`` for a results file at ``out``, plus ``published`` and
    ``allow_dirty``. A published ``out`` from a dirty tree, or from outside a git checkout, raises
    ``UnpublishableTreeError`` unless ``allow_dirty``; allowed, it is recorded as ``dirty: true`` and the
    diff is kept beside ``out``."""
    record = provenance(root, command)
    published = is_published(out, root)
    record.update(published=published, allow_dirty=allow_dirty)
    if not published:
        return record
    if record["commit"] == "unknown":
        if not allow_dirty:
            raise UnpublishableTreeError(
                f"refusing to publish {out}: {Path(root).resolve()} is not a git checkout, so no commit holds the "
                "code that would make the figure; run from a checkout, write --out outside docs/, or pass "
                "--allow-dirty to publish it recorded as dirty")
        record["dirty"] = True
        return record
    if record["dirty"]:
        if not allow_dirty:
            files = changed_files(root)
            shown = ", ".join(files[:DIRTY_FILES_SHOWN])
            more = f" and {len(files) - DIRTY_FILES_SHOWN} more" if len(files) > DIRTY_FILES_SHOWN else ""
            raise UnpublishableTreeError(
                f"refusing to publish {out}: the working tree differs from commit {record['commit'][:12]} in "
                f"{len(files)} file(s): {shown}{more}. Commit them (the figure then names that commit), write "
                "--out outside docs/, or pass --allow-dirty to publish it recorded as dirty with its diff kept "
                "beside it")
        save_diff(root, out)
    return record


def add_allow_dirty_argument(parser: argparse.ArgumentParser) -> None:
    """``--allow-dirty``: publish into docs/ from a tree that differs from HEAD (recorded as dirty)."""
    parser.add_argument("--allow-dirty", action="store_true", help=(
        "write a results file under docs/ although the working tree differs from HEAD; the provenance "
        "records dirty: true and the diff is kept beside the file"))


def publication_or_exit(parser: argparse.ArgumentParser, root: str | Path, out: str | Path | None,
                        allow_dirty: bool) -> dict:
    """``publication_provenance``, or ``parser.error`` with the refusal (exit status 2, no traceback)."""
    try:
        return publication_provenance(root, out, allow_dirty)
    except UnpublishableTreeError as error:
        parser.error(str(error))


def print_and_save_report(report: dict, out: str | Path | None) -> None:
    """``report`` as indented JSON on stdout and, with ``out``, written there atomically."""
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    if out is not None:
        write_text_atomic(Path(out), text + "\n")
