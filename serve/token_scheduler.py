"""Token-step scheduling for autoregressive families: sentences join and leave the decode batch
between token steps (continuous batching), instead of waiting for a whole batch to finish.

    decoder = model.step_decoder(max_rows=64)            # models.interface.TokenStepDecoder
    scheduler = TokenStepScheduler(decoder, executor=model_thread)
    await scheduler.start()
    waveform = await scheduler.submit(SentenceJob(phoneme_ids, family.sampling(seed=0)))

Why not the sentence batcher (serve/batching.py): a padded batch of an autoregressive model holds
every row until its longest sentence stops, so a 5-token sentence batched with a 500-token one pays
for 500 steps. Here a row that stops hands its audio out at once and its place is taken at the next
step by the sentence that has waited longest.

Streaming (``stream_chunks``, a decoder with ``step_chunks``: models.interface.StreamingTokenStepDecoder):
a sentence's audio leaves in chunks while it decodes. ``submit_stream`` hands out a
``SentenceStream`` to iterate; ``submit``'s future still gets the whole waveform.

    async for chunk in scheduler.submit_stream(job):      # (T,) float32 pieces, in order
        ...

Requests take turns as in the sentence batcher: a free row goes to the next sentence of the request
served least recently, so a short request is not queued behind every sentence of a long one.
"""
from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from models.interface import StreamingTokenStepDecoder, TokenStepDecoder
from serve.batching import BatcherClosedError, SentenceJob, batch_request

# Steps run per trip to the model thread when nothing waits to join: fewer trips through the event
# loop, and a waiting sentence still joins within this many steps.
STEPS_PER_TRIP = 8


_END = object()  # a stream's last item: the sentence is complete


@dataclass(eq=False)
class _Waiting:
    job: SentenceJob
    future: asyncio.Future
    request: Hashable
    order: int  # arrival number, for turns within a request
    key: int = field(default=0)
    chunks: asyncio.Queue | None = None  # a streamed sentence's pieces, _END, or the error that stopped it
    pieces: list[np.ndarray] = field(default_factory=list)  # a sentence streamed but wanted whole

    def deliver(self, waveform: np.ndarray, last: bool) -> None:
        if self.future.done():  # cancelled: its client left
            return
        if self.chunks is not None:
            self.chunks.put_nowait(waveform)
            if last:
                self.chunks.put_nowait(_END)
                self.future.set_result(None)
        elif not last:
            self.pieces.append(waveform)
        else:
            self.future.set_result(np.concatenate([*self.pieces, waveform]) if self.pieces else waveform)

    def fail(self, error: BaseException) -> None:
        if self.future.done():
            return
        if self.chunks is not None:  # the stream's reader hears it; the future only marks the row done
            self.chunks.put_nowait(error)
            self.future.set_result(None)
        else:
            self.future.set_exception(error)


class SentenceStream:
    """A sentence's audio chunks (T,) float32 as they are made: ``async for chunk in stream``. Raises
    what failed the sentence; ``cancel()`` frees its row (a client that left)."""

    def __init__(self, waiting: _Waiting):
        self._waiting = waiting

    def __aiter__(self) -> SentenceStream:
        return self

    async def __anext__(self) -> np.ndarray:
        item = await self._waiting.chunks.get()
        if item is _END:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self._waiting.future.cancel()


class TokenStepScheduler:
    """Feeds ``SentenceJob`` s to a ``TokenStepDecoder`` run on ``executor`` (one model thread)."""

    def __init__(self, decoder: TokenStepDecoder, *, executor: Executor,
                 on_step: Callable[[int], None] | None = None, stream_chunks: bool = False):
        """``stream_chunks``: drive ``decoder.step_chunks`` (audio while a sentence decodes) instead of ``step``."""
        if stream_chunks and not isinstance(decoder, StreamingTokenStepDecoder):
            raise ValueError(f"stream_chunks needs a decoder with step_chunks "
                             f"(models.interface.StreamingTokenStepDecoder); {type(decoder).__name__} has none")
        self.streams_chunks = stream_chunks
        self._decoder = decoder
        self._executor = executor
        self._on_step = on_step  # rows decoded per step, for the batch-size metric
        self._waiting: list[_Waiting] = []
        self._decoding: dict[int, _Waiting] = {}
        self._to_cancel: list[int] = []  # rows whose client left, to drop on the model thread's next trip
        self._last_served: dict[Hashable, int] = {}  # request -> the step number it last joined at
        self._keys = itertools.count()
        self._arrivals = itertools.count()
        self._steps = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False

    @property
    def pending(self) -> int:
        """Sentences waiting for a row (not those decoding)."""
        return len(self._waiting)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="token-step-scheduler")

    def submit(self, job: SentenceJob, request: Hashable | None = None) -> asyncio.Future:
        """A future for ``job``'s waveform (T,) float32; cancel it to free its row."""
        return self._enqueue(job, request, stream=False).future

    def submit_stream(self, job: SentenceJob, request: Hashable | None = None) -> SentenceStream:
        """``job``'s audio in chunks as it decodes (a scheduler built with ``stream_chunks``)."""
        if not self.streams_chunks:
            raise ValueError("submit_stream needs a scheduler built with stream_chunks=True; use submit")
        return SentenceStream(self._enqueue(job, request, stream=True))

    def _enqueue(self, job: SentenceJob, request: Hashable | None, stream: bool) -> _Waiting:
        if self._closing or self._task is None:
            raise BatcherClosedError("the scheduler is not running (not started, or shutting down)")
        if request is None:
            request = asyncio.current_task() or object()
        future = asyncio.get_running_loop().create_future()
        waiting = _Waiting(job, future, request, next(self._arrivals), chunks=asyncio.Queue() if stream else None)
        self._waiting.append(waiting)
        self._wakeup.set()
        return waiting

    async def close(self) -> None:
        """Take no new sentences, finish every waiting and decoding one, then stop."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task

    def _next_joiners(self) -> list[_Waiting]:
        """Sentences for the free rows: the request served least recently first, arrival order within."""
        self._waiting = [w for w in self._waiting if not w.future.done()]  # cancelled while waiting
        free = self._decoder.max_rows - len(self._decoding)
        if free <= 0 or not self._waiting:
            return []
        ranked = sorted(self._waiting, key=lambda w: (self._last_served.get(w.request, -1), w.order))
        joiners, seen = [], set()
        for waiting in ranked:  # one sentence per request per round keeps a request's own order
            if len(joiners) == free:
                break
            if waiting.request in seen:
                continue
            seen.add(waiting.request)
            joiners.append(waiting)
        for waiting in joiners:
            self._waiting.remove(waiting)
            self._last_served[waiting.request] = self._steps
        return joiners

    def _advance(self, joiners: list[_Waiting], cancelled: list[int]) -> tuple[list, list]:
        """On the model thread: drop cancelled rows, join new ones, step until a row finishes (or, streaming,
        hands out a chunk) or ``STEPS_PER_TRIP`` steps ran. Returns (audio (key, waveform, last), failed
        joins (waiting, error))."""
        for key in cancelled:
            self._decoder.cancel(key)
        failed = []
        for waiting in joiners:
            try:
                self._decoder.join(waiting.key, batch_request([waiting.job], None))
            except Exception as error:  # a bad sentence fails alone; the other rows decode on
                failed.append((waiting, error))
        made: list[tuple[int, np.ndarray, bool]] = []
        for _ in range(STEPS_PER_TRIP):
            if self._decoder.active == 0:
                break
            if self._on_step is not None:
                self._on_step(self._decoder.active)
            if self.streams_chunks:
                for key, waveform, last in self._decoder.step_chunks():
                    made.append((key, waveform.float().cpu().numpy(), last))
            else:
                for key, result in self._decoder.step():
                    made.append((key, result.waveforms()[0].numpy().astype(np.float32, copy=False), True))
            if made:
                break
        return made, failed

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            joiners = self._next_joiners()
            for waiting in joiners:
                waiting.key = next(self._keys)
                self._decoding[waiting.key] = waiting
            for key in [key for key, waiting in self._decoding.items() if waiting.future.done()]:
                del self._decoding[key]
                self._to_cancel.append(key)
            cancelled, self._to_cancel = self._to_cancel, []
            if not self._decoding and not cancelled:
                if self._closing and not self._waiting:
                    return
                self._wakeup.clear()
                if not self._waiting:
                    await self._wakeup.wait()
                continue
            try:
                made, failed = await loop.run_in_executor(self._executor, self._advance, joiners, cancelled)
            except Exception as error:  # the model failed mid-step: every decoding sentence hears why
                for waiting in self._decoding.values():
                    waiting.fail(error)
                self._decoding.clear()
                continue
            self._steps += 1
            for waiting, error in failed:
                self._decoding.pop(waiting.key, None)
                waiting.fail(error)
            for key, waveform, last in made:
                waiting = self._decoding.pop(key, None) if last else self._decoding.get(key)
                if waiting is not None:
                    waiting.deliver(waveform, last)
