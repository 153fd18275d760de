"""CUDA graphs of a family's engine stages, one per (stage, shape) key, shared by the families'
bucketed engines (models/<family>/engines.py)."""
from __future__ import annotations

import logging
import time

import torch
from torch import nn

log = logging.getLogger(__name__)


class GraphCache:
    """One CUDA graph per (stage, shape) key, all allocating from one memory pool; outputs are
    copied into buffers outside the pool, so no later capture reuses memory they are read from."""

    def __init__(self):
        self.captured: dict[tuple, tuple] = {}  # key -> (graph, static inputs, static outputs)
        self.pool = torch.cuda.graph_pool_handle()

    def run(self, key: tuple, stage: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if key not in self.captured:
            # Logged: a shape first met under load stalls its batch for this long (a compiled stage's
            # first call at a new shape compiles too).
            started_s = time.perf_counter()
            self.captured[key] = self._capture(stage, inputs)
            log.info("captured %s in %.2f s (%d graphs)", key, time.perf_counter() - started_s, len(self.captured))
        graph, static_inputs, static_outputs = self.captured[key]
        for static, value in zip(static_inputs, inputs):
            static.copy_(value)
        graph.replay()
        return static_outputs

    def _capture(self, stage: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple:
        static_inputs = tuple(t.clone() for t in inputs)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph: cuDNN picks its kernels
                sample = as_tuple(stage(*static_inputs))
        torch.cuda.current_stream().wait_stream(stream)
        static_outputs = tuple(torch.empty_like(t) for t in sample)
        del sample
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            for static, value in zip(static_outputs, as_tuple(stage(*static_inputs))):
                static.copy_(value)
        torch.cuda.empty_cache()  # the warm-up runs' activations: captures are rare
        return graph, static_inputs, static_outputs


def replay_times_ms(graph: torch.cuda.CUDAGraph, repeats: int) -> list[float]:
    """Device milliseconds of each of ``repeats`` replays of ``graph``, one after another (benchmarks)."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def as_tuple(outputs) -> tuple[torch.Tensor, ...]:
    return (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)


def to_host(tensor: torch.Tensor, pinned: bool = True) -> torch.Tensor:
    """``tensor`` copied to the host. ``pinned``: into page-locked memory (PyTorch's caching host
    allocator hands freed blocks out again, so this costs no allocation once warm), read in one DMA
    at the bus's speed; a copy to pageable memory is staged through a driver buffer, at a fraction
    of it (the audio of a batch of 16 is several MB). Measured on the H200 behind a CUDA-graph
    engine, the gain is within run-to-run spread (docs/benchmarks.md, session 31): the copy is a
    small part of a batch there."""
    if not pinned or tensor.device.type != "cuda":
        return tensor.cpu()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    torch.cuda.current_stream(tensor.device).synchronize()  # the caller reads it at once
    return host


class StageTimer:
    """Wraps a bucketed engine's ``_run(key, stage, inputs)`` (one call per stage, ``key[0]`` the
    stage's name) with CUDA events: where a synthesis's device time goes, for the profiling scripts."""

    def __init__(self, engine):
        self.events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        run = engine._run

        def timed_run(key, fn, inputs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            outputs = run(key, fn, inputs)
            end.record()
            self.events.append((key[0], start, end))
            return outputs

        engine._run = timed_run

    def take_ms(self) -> dict[str, float]:
        """Device milliseconds per stage since the last call (synchronises)."""
        torch.cuda.synchronize()
        totals: dict[str, float] = {}
        for stage, start, end in self.events:
            totals[stage] = totals.get(stage, 0.0) + start.elapsed_time(end)
        self.events.clear()
        return totals
