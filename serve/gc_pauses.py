"""Python's cyclic garbage collector in a long-lived server: its pauses measured, and the warm heap kept
out of its scans.

A full (generation 2) collection walks every container object the process tracks, holding the GIL
throughout. A warmed-up server holds millions of them that never die: torch.compile's graphs and
guards, the front end's dictionaries (CMUdict, jieba, pypinyin), the CUDA-graph cache's keys. On this
project's CPU, compiling a 30-layer toy convolution stack alone left 623k tracked objects and a 296 ms
full collection. While a collection runs, the model thread cannot launch its next batch, and the GPU
drains once the batch it holds is done. One worker serving EmotiVoice's compiled engine on an H100
(docs/benchmarks.md, session 42) held 1.6 M tracked objects after its warm-up; under load it ran a full
collection about every 6 s, 555-663 ms each, and each ended as the GPU came back from an idle gap.

``gc.freeze()`` after the warm-up moves every object alive then into a permanent generation that no
collection scans; objects made later are collected as usual. A frozen object still dies when its last
reference goes (reference counting is untouched); only a cycle among frozen objects waits for the thaw,
so the heap is collected once just before the freeze. Frozen, a full collection still walks what the
requests in flight hold, and CPython 3.12 runs one whenever the objects promoted since the last outnumber a
quarter of those it left: every ~1.7 s on that H100 under load, 51-152 ms each. A request that ended
inside a reference cycle would add its objects to that count, so the served path leaves none
(tests/serve/test_serve_cyclic_garbage.py). With nothing left in cycles, those frequent full collections
find nothing: one H100 worker under load ran one every ~2.4 s, 53-178 ms each, 4.5 % of its time, and
none of them collected more than 39 objects (session 44). ``space_full_collections`` therefore raises
CPython's third threshold (a full collection waits for that many collections of generation 1; 10 by
default) once the server is warm. ``GcPauseRecorder`` times each
collection through ``gc.callbacks`` into ``tts_gc_pause_seconds`` (by generation) and logs the long
ones, so a server's /metrics shows whether collections still stall it.
"""
from __future__ import annotations

import gc
import logging
import threading
import time

from prometheus_client import Histogram

log = logging.getLogger(__name__)

GC_PAUSE_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LONG_PAUSE_S = 0.05  # pauses at least this long are logged: a few ms is a GPU batch's launch slack


class GcPauseRecorder:
    """Times every garbage collection of this process into ``histogram`` (labelled by generation) while
    installed. A collection runs on whichever thread allocated past the threshold, and callbacks run on
    that thread between its "start" and "stop" phases, so one start time per thread suffices."""

    def __init__(self, histogram: Histogram, long_pause_s: float = LONG_PAUSE_S):
        self.histogram = histogram
        self.long_pause_s = long_pause_s
        self._started = threading.local()
        self._installed = False

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started.at_s = time.perf_counter()
            return
        started_s = getattr(self._started, "at_s", None)
        if started_s is None:  # installed during a collection
            return
        self._started.at_s = None
        pause_s = time.perf_counter() - started_s
        self.histogram.labels(str(info["generation"])).observe(pause_s)
        if pause_s >= self.long_pause_s:
            log.warning("garbage collection of generation %d held the GIL for %.0f ms (%d objects collected, "
                        "%d frozen)", info["generation"], pause_s * 1e3, info["collected"], gc.get_freeze_count())

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self)
            self._installed = False


def freeze_warm_heap() -> int:
    """Collect once, then move every object still alive out of the collector's scans (module docstring).
    Returns how many objects are frozen now."""
    started_s = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("garbage collector: %d objects of the warm heap frozen out of its scans (%.0f ms)", frozen,
             (time.perf_counter() - started_s) * 1e3)
    return frozen


def space_full_collections(young_collections: int) -> tuple[int, int, int]:
    """Let a full collection run only after ``young_collections`` collections of generation 1 (CPython's
    third threshold). Returns the thresholds it replaces, for ``restore_thresholds``."""
    if young_collections < 1:
        raise ValueError(f"young_collections must be >= 1, got {young_collections}")
    previous = gc.get_threshold()
    gc.set_threshold(previous[0], previous[1], young_collections)
    return previous


def restore_thresholds(thresholds: tuple[int, int, int]) -> None:
    """Put back what ``space_full_collections`` returned (a server that stops, in a process that goes on)."""
    gc.set_threshold(*thresholds)


def unfreeze_heap() -> None:
    """Hand the frozen objects back to the collector (a server that stops, in a process that goes on)."""
    gc.unfreeze()
