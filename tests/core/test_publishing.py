"""core/publishing.py: a results file under docs/ is refused from a dirty tree (the error names the
changed files) unless --allow-dirty, which records ``dirty: true`` and keeps the diff; files written
elsewhere are never refused. Checked on temporary git repositories (an entry point:
tests/evaluate/test_gpu_results_publishing.py).

    python -m pytest -q tests/core/test_publishing.py
"""
from __future__ import annotations

import subprocess

import pytest
from conftest import run_git

from core.publishing import UnpublishableTreeError, is_published, publication_provenance


@pytest.fixture
def repo(tmp_path):
    """A checkout with one commit holding src/model.py and docs/results/."""
    root = tmp_path / "checkout"
    (root / "src").mkdir(parents=True)
    (root / "docs" / "results").mkdir(parents=True)
    (root / "src" / "model.py").write_text("SCALE = 1\n")
    (root / "docs" / "results" / "old.json").write_text("{}\n")
    run_git(root, "init", "-q")
    run_git(root, "add", ".")
    run_git(root, "commit", "-qm", "first")
    return root


def test_published_paths_are_docs_results_and_the_benchmarks_page(repo):
    assert is_published(repo / "docs" / "results" / "cpu_9_x.json", repo)
    assert is_published(repo / "docs" / "results" / "sub" / "x.json", repo)
    assert is_published(repo / "docs" / "benchmarks.md", repo)
    assert not is_published(repo / "outputs" / "x.json", repo)
    assert not is_published(repo / "docs" / "architecture_results.json", repo)
    assert not is_published(None, repo)


def test_a_clean_tree_publishes_with_its_commit(repo):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    record = publication_provenance(repo, repo / "docs" / "results" / "new.json")
    assert (record["commit"], record["dirty"], record["published"], record["allow_dirty"]) == (head, False, True, False)


def test_a_dirty_tree_is_refused_naming_the_files_then_allowed_and_recorded(repo):
    (repo / "src" / "model.py").write_text("SCALE = 2\n")
    (repo / "src" / "untracked_tweak.py").write_text("x = 1\n")
    out = repo / "docs" / "results" / "new.json"
    with pytest.raises(UnpublishableTreeError) as refused:
        publication_provenance(repo, out)
    message = str(refused.value)
    assert "src/model.py" in message and "src/untracked_tweak.py" in message and "2 file(s)" in message
    assert "--allow-dirty" in message and not out.with_suffix(".diff").exists()

    record = publication_provenance(repo, out, allow_dirty=True)
    assert (record["dirty"], record["allow_dirty"], record["published"]) == (True, True, True)
    kept = out.with_suffix(".diff").read_text()
    assert "+SCALE = 2" in kept and "untracked: src/untracked_tweak.py" in kept

    scratch = publication_provenance(repo, repo / "outputs" / "run.json")  # not published: never refused
    assert (scratch["dirty"], scratch["published"]) == (True, False)


def test_outside_a_git_checkout_publishing_is_refused_unless_allowed(tmp_path):
    out = tmp_path / "docs" / "results" / "x.json"
    with pytest.raises(UnpublishableTreeError, match="not a git checkout"):
        publication_provenance(tmp_path, out)
    record = publication_provenance(tmp_path, out, allow_dirty=True)
    assert (record["commit"], record["dirty"]) == ("unknown", True)
