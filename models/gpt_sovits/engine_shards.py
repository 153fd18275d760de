"""Several T2S engines on one GPU, each on its own CUDA stream, run as one continuously batched decoder.

The idea (measured before admissions became CUDA graphs and the 64-row step seven kernels a layer):
a 64-row decode step was ~270 small kernels (products of 64 rows, LayerNorms, the attention over
each row's keys), and an admission (then an eager prefill of several hundred kernel launches, 6-21 ms
on the H200) stopped every row's decoding while the host issued it. Shards of 16 or
32 slots on separate streams could run their steps side by side, and while the host prefills one
shard, the steps queued for the others would keep the GPU busy. Measured on the H200 (64 streams,
docs/benchmarks.md, "GPT-SoVITS v2: the 64-stream step on tensor cores"), it does not pay: 2 x 32
and 4 x 16 cuBLAS shards make 41,300 and 39,100 tokens/s with every slot full against 45,700 for
one 64-slot engine, and the same aggregate within the rounds' spread. Kept as a tested way to run
several engines from one queue; ``T2SEngine`` alone remains the 64-stream default.

    engines = [T2SEngine(weights, max_batch=16, max_len=640) for _ in range(4)]   # weights shared
    for engine in engines:
        engine.capture_graphs()
    sharded = ShardedT2SEngines(engines)
    results = sharded.generate(requests)        # in the order given

Each shard keeps the engine's own rules: a request's tokens do not depend on the rows beside it, so
a greedy request gets the official tokens in any shard (GPU test, float32); in FP16 a shard of
another batch size may round differently (cuBLAS picks kernels by shape). Requests wait in one
queue, first come first served, and go to a shard when it has a free slot; the shards take turns,
each turn collecting its finished rows (a wait on its own stream only), admitting, and queueing
``sync_every`` steps.
"""
from __future__ import annotations

import collections
import itertools

import torch

from models.gpt_sovits.engine import T2SEngine, T2SRequest, T2SResult


class ShardedT2SEngines:
    """``engines`` (CUDA, graphs captured, nothing in flight) driven as one decoder."""

    def __init__(self, engines: list[T2SEngine]):
        if not engines:
            raise ValueError("give at least one engine")
        if any(engine.device.type != "cuda" for engine in engines):
            raise ValueError("sharded engines run on CUDA streams: every engine must be on a CUDA device")
        if any(engine.has_work() for engine in engines):
            raise ValueError("the engines must have no request in flight")
        # One queue serves every shard, so each must take any request the first takes.
        if any(engine.weights is not engines[0].weights or engine.max_len != engines[0].max_len for engine in engines):
            raise ValueError("the shards must share one T2SWeights and one max_len")
        self.engines = engines
        self.streams = [torch.cuda.Stream(engine.device) for engine in engines]
        self._waiting: collections.deque[tuple[int, T2SRequest]] = collections.deque()
        self._placed: dict[int, tuple[int, int]] = {}  # request id -> (shard, the shard's own request id)
        self._request_ids = itertools.count()

    def submit(self, request: T2SRequest) -> int:
        """Queue ``request``; returns its id. Checked by the first shard's rules (all shards share them)."""
        self.engines[0].check_request(request)
        request_id = next(self._request_ids)
        self._waiting.append((request_id, request))
        return request_id

    def has_work(self) -> bool:
        return bool(self._waiting) or any(engine.has_work() for engine in self.engines)

    def _place(self, shard: int) -> None:
        """Hand waiting requests, oldest first, to ``shard`` while it has free slots."""
        engine = self.engines[shard]
        for _ in range(min(engine.free_slots(), len(self._waiting))):
            request_id, request = self._waiting.popleft()
            self._placed[request_id] = (shard, engine.submit(request))

    def _after_default_stream(self) -> None:
        """Order the shard streams after the work already queued on the current stream (the
        engines' state resets after capture, tensors a caller put on the device)."""
        for engine, stream in zip(self.engines, self.streams):
            stream.wait_stream(torch.cuda.current_stream(engine.device))

    def admit(self) -> None:
        """Prefill waiting requests into every shard's free slots, without decoding."""
        self._after_default_stream()
        for shard, engine in enumerate(self.engines):
            with torch.cuda.stream(self.streams[shard]):
                self._place(shard)
                engine.admit()

    def _turn(self, shard: int) -> None:
        engine = self.engines[shard]
        with torch.cuda.stream(self.streams[shard]):
            engine.collect()  # waits for this shard's queued steps only
            self._place(shard)
            engine.admit()
            engine.advance(engine.sync_every)

    def run(self) -> None:
        """Decode until every submitted request has stopped; results wait in ``result(id)``."""
        self._after_default_stream()
        while self.has_work():
            for shard in range(len(self.engines)):
                self._turn(shard)
        for stream in self.streams:
            stream.synchronize()

    def result(self, request_id: int) -> T2SResult:
        shard, local_id = self._placed.pop(request_id)
        return self.engines[shard].result(local_id)

    def generate(self, requests: list[T2SRequest]) -> list[T2SResult]:
        """Decode ``requests`` across the shards; results in the order given."""
        request_ids = [self.submit(request) for request in requests]
        self.run()
        return [self.result(request_id) for request_id in request_ids]
