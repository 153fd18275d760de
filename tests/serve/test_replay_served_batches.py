"""scripts/replay_served_batches.py: the served model path without HTTP, on the bundled Piper voice on
this CPU; and its capture counter, which once deadlocked on the first capture it was told of."""
from __future__ import annotations

import json
import logging
import threading

import pytest

from scripts import replay_served_batches as replay


def test_the_capture_counter_counts_what_the_graph_cache_logs():
    """The graph cache logs each capture as ("captured %s in %.2f s (%d graphs)", key, seconds, count):
    the counter adds them up, from any thread, without holding the logging handler's own lock twice."""
    counter = replay.CaptureCounter()
    log = logging.getLogger("models.cuda_graphs.test_replay")
    log.addHandler(counter)
    log.setLevel(logging.INFO)
    log.propagate = False

    def log_two_captures():
        for index, seconds in enumerate((0.25, 0.5)):
            log.info("captured %s in %.2f s (%d graphs)", ("frames", 32, 64, 96), seconds, index + 1)

    try:
        thread = threading.Thread(target=log_two_captures, daemon=True)  # daemon: a deadlock fails, not hangs
        thread.start()
        thread.join(timeout=10)
        assert not thread.is_alive(), "logging a capture blocked"
    finally:
        log.removeHandler(counter)
    assert counter.snapshot() == (2, pytest.approx(0.75))


@pytest.mark.slow
def test_replay_runs_the_warm_up_and_times_each_batch_size(tmp_path):
    from serve.engines import load_served_model
    from serve.gc_pauses import unfreeze_heap
    from serve.settings import ServeSettings
    from serve.speech import warmup_batches

    settings = {"family": "piper", "source": "teacher", "device": "cpu", "max_batch_size": 4,
                "length_buckets": [64], "warmup_length_scales": [1.0]}
    out = tmp_path / "replay.json"
    try:
        report = replay.main(["--settings", json.dumps(settings), "--sizes", "2", "4", "--repeats", "1",
                              "--threads", "2", "--seconds", "1", "--profile", "--out", str(out)])
    finally:
        unfreeze_heap()  # the replay froze this test process's heap, as a server does after its warm-up
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    serve_settings = ServeSettings.from_json(json.dumps(settings))
    assert report["warmup"]["batches"] == len(warmup_batches(load_served_model(serve_settings), serve_settings))
    heap = report["warmup"]["gc"]  # a full collection of the frozen heap scans almost nothing
    assert heap["frozen_objects"] > 0.5 * heap["tracked_objects"] > 0
    assert heap["full_collection_ms_frozen"] < 0.5 * heap["full_collection_ms"]
    for size in ("2", "4"):
        row = report["one_at_a_time"][size]
        assert row["median_ms"] > 0 and row["sentences_per_s"] == pytest.approx(int(size) / row["median_ms"] * 1000)
        assert row["captures"] == 0  # the eager CPU engine captures nothing
    assert report["concurrent"]["batches"] >= 2 and report["concurrent"]["threads"] == 2
    profiled = report["profile"]  # on this CPU no kernel has device time: the host ops carry the batch
    assert profiled["batch"] == 4 and profiled["wall_ms"] > 0 and profiled["kernel_ms"] == 0
    assert profiled["top_host_ops"] and all(op["self_ms"] >= 0 for op in profiled["top_host_ops"])
    with pytest.raises(SystemExit):  # a size the settings' batches never reach
        replay.main(["--settings", json.dumps(settings), "--sizes", "8", "--out", str(tmp_path / "no.json")])


def test_a_sentence_set_that_does_not_load_is_refused_before_the_model(tmp_path, capsys, monkeypatch):
    def no_model(settings):
        raise AssertionError("the model loaded before the sentence set was checked")

    monkeypatch.setattr(replay, "load_served_model", no_model)
    settings = {"family": "piper", "source": "teacher", "device": "cpu", "max_batch_size": 4}
    with pytest.raises(SystemExit):
        replay.main(["--settings", json.dumps(settings), "--sizes", "2", "--sentence-set", "klingon",
                     "--out", str(tmp_path / "no.json")])
    assert "unknown sentence set 'klingon'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # Mandarin sentences are 13-19 characters: none of 30-40
        replay.main(["--settings", json.dumps(settings), "--sizes", "2", "--sentence-set", "eval_zh",
                     "--min-words", "30", "--max-words", "40", "--out", str(tmp_path / "no.json")])
    assert "no sentence of 30..40 words" in capsys.readouterr().err

