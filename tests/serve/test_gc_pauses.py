"""The server's garbage-collector handling (serve/gc_pauses.py): every collection is timed into the
``tts_gc_pause_seconds`` histogram and long ones are logged; after the warm-up the heap alive then is
frozen out of the collector's scans (a cycle alive at the freeze and dropped after it survives full
collections, one made after it does not), full collections are spaced further apart, and a server that
stops hands both back.

    python -m pytest -q tests/serve/test_gc_pauses.py
"""
from __future__ import annotations

import gc
import logging
import weakref

import pytest
from prometheus_client import CollectorRegistry, Histogram
from serve_support import tiny_family_client

from models.registry import FAMILIES
from serve.gc_pauses import (
    GcPauseRecorder,
    freeze_warm_heap,
    restore_thresholds,
    space_full_collections,
    unfreeze_heap,
)


class Node:
    """A container that can sit in a reference cycle and be watched through a weak reference."""

    def __init__(self):
        self.other = None


def cycle() -> Node:
    """One node of a two-node reference cycle: once no name holds it, only the cyclic collector frees it."""
    first, second = Node(), Node()
    first.other, second.other = second, first
    return first


REGISTRY = CollectorRegistry()
HISTOGRAM = Histogram("gc_pause_seconds", "test", ["generation"], buckets=(0.001, 1.0), registry=REGISTRY)


def observed(generation: int) -> float:
    """Collections of ``generation`` timed so far."""
    return REGISTRY.get_sample_value("gc_pause_seconds_count", {"generation": str(generation)}) or 0.0


def test_every_collection_is_timed_while_installed():
    recorder = GcPauseRecorder(HISTOGRAM)
    recorder.install()
    try:
        gc.collect()
    finally:
        recorder.uninstall()
    count = observed(2)
    assert count >= 1
    gc.collect()
    assert observed(2) == count  # uninstalled: no more samples


def test_a_long_pause_is_logged(caplog):
    recorder = GcPauseRecorder(HISTOGRAM, long_pause_s=0.0)
    recorder.install()
    try:
        with caplog.at_level(logging.WARNING, logger="serve.gc_pauses"):
            gc.collect()
    finally:
        recorder.uninstall()
    assert any("garbage collection of generation 2" in record.getMessage() for record in caplog.records)


def test_a_cycle_alive_at_the_freeze_outlives_full_collections_and_a_later_one_does_not():
    warm = cycle()  # alive when the heap is frozen, garbage after: as a warm-up's temporaries can become
    warm_ref = weakref.ref(warm)
    try:
        frozen = freeze_warm_heap()
        # Frozen objects still die by reference counting, so another thread of this process (a server
        # another test left stopping) can lower the count as soon as the freeze returns.
        assert 0 < gc.get_freeze_count() <= frozen
        late = cycle()
        late_ref = weakref.ref(late)
        del warm, late
        gc.collect()
        assert warm_ref() is not None  # frozen: out of the collector's scans
        assert late_ref() is None
        unfreeze_heap()
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert warm_ref() is None  # handed back, collected
    finally:
        unfreeze_heap()


def full_collections_under_load(young_collections: int) -> int:
    """Full collections, the heap frozen as a warm server's is, while containers live a while and then die
    by reference counting, as a loaded server's requests do: each survives young collections into the
    old generation, none is garbage."""
    counted = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            counted.append(1)

    freeze_warm_heap()
    # The freeze leaves CPython's count of long-lived objects at the whole heap, so until a full pass has
    # run, a quarter of the heap must be promoted before the next (13 s into an H100 server's load);
    # after it only the unfrozen objects count, as in the server's steady state.
    gc.collect()
    previous = space_full_collections(young_collections)
    gc.callbacks.append(count)
    try:
        in_flight = []
        for index in range(1_000_000):
            in_flight.append([index])  # a tracked container
            if len(in_flight) > 20_000:
                del in_flight[:10_000]
    finally:
        gc.callbacks.remove(count)
        restore_thresholds(previous)
        unfreeze_heap()
    return len(counted)


def test_spaced_full_collections_come_less_often_and_the_thresholds_come_back():
    before = gc.get_threshold()
    default = full_collections_under_load(10)
    spaced = full_collections_under_load(100)
    assert gc.get_threshold() == before
    assert default >= 3, default  # at CPython's default the load brings several
    assert spaced * 3 <= default, (spaced, default)
    with pytest.raises(ValueError, match="young_collections must be >= 1"):
        space_full_collections(0)


@pytest.mark.parametrize("freeze", [True, False])
def test_the_server_freezes_after_its_warm_up_and_thaws_when_it_stops(tmp_path, freeze):
    family = FAMILIES["piper"]
    before = gc.get_threshold()
    with tiny_family_client(family, family.tiny_model(0), tmp_path, f"serve.gc_freeze={str(freeze).lower()}",
                            "serve.gc_full_collection_after=37") as (client, _):
        assert gc.get_threshold() == (*before[:2], 37)
        assert (gc.get_freeze_count() > 0) == freeze
        gc.collect()
        metrics = client.get("/metrics").text
        count = next(line for line in metrics.splitlines() if line.startswith('tts_gc_pause_seconds_count{generation="2"}'))
        assert float(count.split()[-1]) >= 1
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
