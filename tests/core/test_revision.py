"""compress/revision.py: a result names the code it came from, and says when the files are not that commit."""
from __future__ import annotations

import subprocess

from core.revision import git_revision


def _git(root, *args):
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=root, check=True,
                   capture_output=True)


def test_clean_dirty_and_outside_a_checkout(tmp_path):
    assert git_revision(tmp_path) == "unknown"
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-qm", "first")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert git_revision(tmp_path) == head
    # Files newer than the commit: what a copied tree with an older .git looks like.
    (tmp_path / "a.txt").write_text("two\n")
    assert git_revision(tmp_path) == head + "-dirty"
