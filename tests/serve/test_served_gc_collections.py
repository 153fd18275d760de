"""scripts/served_gc_collections.py measures a real loaded server: a family's tiny model on uvicorn,
load from serve.loadtest in another process, and the collections of the measured level read from the
server's /metrics, for each value of gc_full_collection_after asked for.

    python -m pytest -q tests/serve/test_served_gc_collections.py
"""
from __future__ import annotations

import gc
import json

from scripts import served_gc_collections


def test_each_arm_reports_its_level_and_the_collections_within_it(tmp_path):
    thresholds = gc.get_threshold()
    out = tmp_path / "gc.json"
    report = served_gc_collections.main(["--family", "piper", "--after", "10", "100", "--rounds", "1",
                                         "--concurrency", "8", "--sentences", "2", "--seconds", "2",
                                         "--warm-seconds", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert [arm["gc_full_collection_after"] for arm in report["arms"]] == [10, 100]
    for arm in report["arms"]:
        assert arm["requests_ok"] > 0 and arm["sentences_per_s"] > 0
        assert set(arm["collections"]) == {"0", "1", "2"}
        young = arm["collections"]["0"]
        assert young["count"] >= 1 and young["seconds"] > 0  # serving allocates: young collections run
        assert 0 <= arm["gil_share_of_full_collections"] < 1
    assert gc.get_threshold() == thresholds  # each server put the collector back as it stopped
