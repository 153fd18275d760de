"""core/revision.py: a result names the code it came from, and says when the files are not that commit."""
from __future__ import annotations

import subprocess

import hashlib

from core.revision import git_revision, provenance, save_diff


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


def test_provenance_records_the_diff_it_ran_with_and_keeps_it(tmp_path):
    assert provenance(tmp_path)["commit"] == "unknown"
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-qm", "first")
    clean = provenance(tmp_path, command=["python", "-m", "x"])
    assert (clean["dirty"], clean["diff_sha256"], clean["command"]) == (False, None, "python -m x")
    assert clean["machine"]["cpu_count"] >= 1 and clean["date_utc"].endswith("+00:00")
    assert save_diff(tmp_path, tmp_path / "results.json") is None
    (tmp_path / "a.txt").write_text("two\n")
    (tmp_path / "new.py").write_text("x = 1\n")
    dirty = provenance(tmp_path)
    kept = save_diff(tmp_path, tmp_path / "out" / "results.json")
    assert dirty["dirty"] and kept == tmp_path / "out" / "results.diff"
    text = kept.read_text()
    assert "+two" in text and "untracked: new.py" in text
    assert dirty["diff_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    (tmp_path / "new.py").write_text("x = 2\n")  # a new file's contents, not only its name, make the hash
    assert provenance(tmp_path)["diff_sha256"] != dirty["diff_sha256"]
