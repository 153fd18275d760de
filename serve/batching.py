"""Dynamic batching: sentences from many requests run as one padded batch, then split back.

    batcher = DynamicBatcher(lambda jobs: synthesize_jobs(model, jobs, noise_channels),
                             max_batch_size=8, max_wait_ms=10, length_buckets=(64, 128, 256),
                             executor=model_thread)
    await batcher.start()
    waveform = await batcher.submit(SentenceJob(phoneme_ids, family.sampling(seed=0)))

A sentence waits at most ``max_wait_ms`` for others of its group: the same length bucket (so a
short sentence is not padded to a long one), the same sampling but for the seed (the model takes
one set of sampling options per batch) and the same voice. A full group leaves at once;
``BatchBudget`` fills a batch before ``max_batch_size`` when its sentences are long or slow (it
bounds the activation memory). Up to ``batches_in_flight`` batches run at a time on ``executor``
(which needs as many threads); sentences that arrive meanwhile gather into the next batches. Two
in flight let a GPU engine prepare one batch on the host (noise, padding) while the device runs
the other: a family's bucketed engine serialises only its device section. One (the default)
suits engines that already use every core.

Requests take turns: each batch is formed around the next sentence of the request served least
recently (one never served goes first, in arrival order), and fills with the sentences of that
sentence's group round-robin by request (every request's next sentence in turn order, then every
request's second...). A request's own sentences keep their order. So a short request that arrives
while long ones wait joins the next batch that forms, instead of waiting behind all of their
sentences: first-in first-out made a 5-word request wait 12.2 s behind one 4096-character request on
2 CPU cores. A full group that is not the turn's still leaves at once when the turn's group is
still gathering (within ``max_wait_ms``). ``submit``'s ``request`` says which request a sentence is
of; by default the calling task's (the speech service submits each request's sentences from one).

This is the batching of non-autoregressive families, whose whole sentence is one model call. An
autoregressive family decodes tokens step by step: serve/token_scheduler.py batches it by token
step instead (the app picks one from the family's capabilities).

Batching never changes a sentence's audio: a sampling type that draws explicit noise tensors
(``draw``) gets each sentence's own noise from its own seed, exactly as an unbatched call would
(``sentence_noise``), zero-padded into the batch. What remains is float rounding in batched
kernels and the decoder's convolutions seeing padding past a sentence's last frame: about 1e-4
on [-1, 1] samples (tests/serve/test_serve_batching.py).
"""
from __future__ import annotations

import asyncio
import bisect
import dataclasses
import itertools
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from models.interface import SynthesisRequest, TTSModel, VoiceCondition
from models.sampling import Sampling


@dataclass(frozen=True)
class SentenceJob:
    """One sentence of one request: what the batcher groups."""

    phoneme_ids: tuple[int, ...]
    sampling: Sampling = field(default_factory=Sampling)  # the family's sampling, with this sentence's seed
    speaker_id: int | None = None
    # Conditioning a whole batch shares (a prompt, an emotion, a reference clip); ``voice_key`` names it,
    # so sentences of equal conditioning from different requests can share a batch.
    voice: VoiceCondition | None = field(default=None, compare=False)
    voice_key: tuple = ()

    @property
    def group(self) -> tuple:
        """What sentences of one batch share: the sampling but for its seed, the voice, speaker ids or none."""
        return dataclasses.replace(self.sampling, seed=None), self.voice_key, self.speaker_id is None


def sentence_noise(job: SentenceJob, noise_channels: int, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """The noise tensors of ``job`` alone, each (1, C, T): for VITS-style sampling (duration_noise
    (1, 2, T_text), prior_noise (1, C_latent, T_frames_cap)).

    The same draw as an unbatched ``SynthesisRequest`` of this one sentence with ``job.sampling`` on
    ``device``, so batching cannot change the sentence's noise.
    """
    return job.sampling.draw(1, len(job.phoneme_ids), noise_channels, device)


def _batch_sampling(jobs: list[SentenceJob], noise_channels: int | None, device: str) -> Sampling:
    """The batch's sampling: the shared options, and per-row noise where the sampling type draws tensors.

    A sampling type without ``draw`` leaves randomness to the model, which sees one seed per batch
    (the first sentence's): its sentences sound the same batched or not only when sampling is
    deterministic."""
    shared = jobs[0].sampling
    if not callable(getattr(shared, "draw", None)):
        return shared
    if noise_channels is None:
        raise ValueError(f"{type(shared).__name__} draws noise tensors: give the model's noise_channels")
    noises = [sentence_noise(job, noise_channels, device) for job in jobs]
    # One padding op per tensor, not one indexed copy per row: on a GPU engine each row copy is a
    # launch from Python (py-spy on the H200: 28 % of the model thread was in this function).
    duration_noise, prior_noise = (
        pad_sequence([noise[k][0].T for noise in noises], batch_first=True).transpose(1, 2)  # (B, C, T) padded
        for k in range(2))
    return dataclasses.replace(shared, duration_noise=duration_noise, prior_noise=prior_noise)


def batch_request(jobs: list[SentenceJob], noise_channels: int | None, device: str = "cpu") -> SynthesisRequest:
    """One padded request for ``jobs`` (one group), each with its own noise padded in.

    ``device``: where the noise is drawn and padded (a GPU engine's: host draws would cost more
    than its synthesis)."""
    groups = {job.group for job in jobs}
    if len(groups) != 1:
        raise ValueError("a batch shares one sampling (but for the seed), one voice and speaker ids on every "
                         f"sentence or on none; got {len(groups)} groups: {sorted(map(str, groups))}")
    phoneme_ids = pad_sequence([torch.tensor(job.phoneme_ids, dtype=torch.long) for job in jobs],
                               batch_first=True)  # (B, T_text)
    speaker_id = None if jobs[0].speaker_id is None else torch.tensor([job.speaker_id for job in jobs])  # (B,)
    voice = jobs[0].voice
    if speaker_id is not None:
        voice = dataclasses.replace(voice or VoiceCondition(), speaker_id=speaker_id)
    return SynthesisRequest(
        phoneme_ids=phoneme_ids,
        phoneme_lengths=torch.tensor([len(job.phoneme_ids) for job in jobs], dtype=torch.long),
        sampling=_batch_sampling(jobs, noise_channels, device),
        voice=voice,
    )


def synthesize_jobs(model: TTSModel, jobs: list[SentenceJob], noise_channels: int | None,
                    noise_device: str = "cpu") -> list[np.ndarray]:
    """One batched ``synthesize`` for ``jobs``; each sentence's waveform (T_i,) float32, trimmed."""
    result = model.synthesize(batch_request(jobs, noise_channels, noise_device))
    return [waveform.numpy().astype(np.float32, copy=False) for waveform in result.waveforms()]


def _round_up(value: int, buckets: tuple[int, ...]) -> int:
    """The first bucket >= ``value``; ``value`` itself when there are no buckets or it is past them."""
    index = bisect.bisect_left(buckets, value)
    return buckets[index] if index < len(buckets) else value


@dataclass(frozen=True)
class BatchBudget:
    """The most work one batch may hold, in phoneme ids x length_scale after the engine's padding.

    A VITS batch's activation memory grows with rows x frames, and frames with phoneme ids x
    length_scale (the pace). Without a cap, one batch of 32 sentences of 512 ids at pace 1.25 held
    23.6 GiB of activations in the H200's CUDA graph pool (2026-11-30), in every server process.
    ``row_buckets`` and ``length_buckets`` are the shapes a bucketed engine pads a batch to (empty
    when it runs the exact shape), so the cost is what the engine really runs. A sentence that
    alone exceeds the cap still runs, alone."""

    max_phonemes: float
    row_buckets: tuple[int, ...] = ()
    length_buckets: tuple[int, ...] = ()

    def cost(self, rows: int, longest: int, length_scale: float) -> float:
        return _round_up(rows, self.row_buckets) * _round_up(longest, self.length_buckets) * length_scale

    def fits(self, rows: int, longest: int, length_scale: float) -> bool:
        return rows == 1 or self.cost(rows, longest, length_scale) <= self.max_phonemes


class QueueFullError(RuntimeError):
    """The server holds as much work as it is configured to; the client should retry later."""


class BatcherClosedError(RuntimeError):
    """The batcher is shutting down and takes no new sentences."""


@dataclass(eq=False)
class _Request:
    """One request's place in the turns: ``last_batch`` is the number of the last batch that held one
    of its sentences (-1: none yet, so it goes before every request served already)."""

    arrival: int
    submitted: int = 0
    last_batch: int = -1


@dataclass
class _Waiting:
    job: SentenceJob
    future: asyncio.Future
    enqueued_s: float
    request: _Request
    index: int  # the sentence's place in its request


class DynamicBatcher:
    """Groups ``SentenceJob`` s into batches for ``run_batch`` (a blocking call run on ``executor``)."""

    def __init__(self, run_batch: Callable[[list[SentenceJob]], list[np.ndarray]], *, max_batch_size: int,
                 max_wait_ms: float, length_buckets: tuple[int, ...], executor: Executor,
                 on_batch: Callable[[int], None] | None = None, batches_in_flight: int = 1,
                 budget: BatchBudget | None = None):
        if max_batch_size < 1 or max_wait_ms < 0 or batches_in_flight < 1:
            raise ValueError("max_batch_size and batches_in_flight must be >= 1 and max_wait_ms >= 0, got "
                             f"{max_batch_size}, {batches_in_flight}, {max_wait_ms}")
        self._run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.length_buckets = tuple(length_buckets)
        self._executor = executor
        self._on_batch = on_batch
        self._groups: dict[tuple, list[_Waiting]] = {}  # in submission order
        self._requests: dict[Hashable, _Request] = {}  # those with sentences waiting
        self._arrivals = itertools.count()
        self._batches_formed = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self.batches_in_flight = batches_in_flight
        self.budget = budget
        self._running: set[asyncio.Task] = set()  # batches on the executor now

    def bucket_of(self, length: int) -> int:
        """Index of the first bucket bound >= ``length``; ``len(length_buckets)`` past the last one."""
        return bisect.bisect_left(self.length_buckets, length)

    @property
    def pending(self) -> int:
        """Sentences waiting for a batch (not counting the batch running now), without those of requests that
        gave up: they stay in their group until the next batch is formed, which may be a batch's time away."""
        return sum(not waiting.future.done() for group in self._groups.values() for waiting in group)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="dynamic-batcher")

    def submit(self, job: SentenceJob, request: Hashable | None = None) -> asyncio.Future:
        """A future for ``job``'s waveform (T,) float32; cancel it to drop the job if it has not run.

        ``request``: what the sentences of one request share, so that requests take turns; None: the
        calling task (every sentence one task submits counts as one request's, in submission order)."""
        if self._closing or self._task is None:
            raise BatcherClosedError("the batcher is not running (not started, or shutting down)")
        if request is None:
            request = asyncio.current_task() or object()
        if request not in self._requests:
            self._requests[request] = _Request(next(self._arrivals))
        owner = self._requests[request]
        key = (self.bucket_of(len(job.phoneme_ids)), job.group)
        future = asyncio.get_running_loop().create_future()
        self._groups.setdefault(key, []).append(_Waiting(job, future, time.monotonic(), owner, owner.submitted))
        owner.submitted += 1
        self._wakeup.set()
        return future

    async def close(self) -> None:
        """Take no new sentences, run every waiting one without further waiting, then stop."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task

    def _batch_size(self, group: list[_Waiting]) -> int:
        """How many of ``group``'s first sentences one batch takes: at most max_batch_size, within budget."""
        size = min(len(group), self.max_batch_size)
        if self.budget is None:
            return size
        longest = 0
        for rows, waiting in enumerate(group[:size], start=1):
            longest = max(longest, len(waiting.job.phoneme_ids))
            if not self.budget.fits(rows, longest, waiting.job.sampling.length_scale):
                return rows - 1
        return size

    def _in_turn_order(self, group: list[_Waiting], turn: dict[int, int]) -> list[_Waiting]:
        """``group`` round-robin by request: each request's first sentence here in turn order, then each one's
        second... (``turn``: a request's id -> its place in the turns)."""
        seen: dict[int, int] = {}
        rounds = []
        for waiting in group:  # a request's sentences are in its own order here
            rounds.append(seen.get(id(waiting.request), 0))
            seen[id(waiting.request)] = rounds[-1] + 1
        order = sorted(range(len(group)), key=lambda k: (rounds[k], turn[id(group[k].request)]))
        return [group[k] for k in order]

    def _next_batch(self, now_s: float) -> tuple[list[_Waiting], float | None]:
        """(a batch to run now or [], seconds until the turn's group is due or None)."""
        for key in list(self._groups):  # drop requests that gave up (timed out, disconnected)
            self._groups[key] = [w for w in self._groups[key] if not w.future.done()]
            if not self._groups[key]:
                del self._groups[key]
        waiting_requests = {id(w.request) for group in self._groups.values() for w in group}
        self._requests = {name: r for name, r in self._requests.items() if id(r) in waiting_requests}
        if not self._groups:
            return [], None
        turns = sorted(self._requests.values(), key=lambda r: (r.last_batch, r.arrival))
        turn = {id(request): place for place, request in enumerate(turns)}
        ordered = {key: self._in_turn_order(group, turn) for key, group in self._groups.items()}
        # The turn's group: the one holding the next sentence of the request whose turn it is.
        turn_key = min(ordered, key=lambda k: (turn[id(ordered[k][0].request)], ordered[k][0].index))
        # Full: the next batch of this group cannot grow (max_batch_size or the budget reached).
        full_keys = [k for k, group in ordered.items()
                     if self._batch_size(group) < len(group) or len(group) == self.max_batch_size]
        due_s = min(w.enqueued_s for w in ordered[turn_key]) + self.max_wait_s
        if turn_key in full_keys or self._closing or now_s >= due_s:
            key = turn_key
        elif full_keys:
            key = min(full_keys, key=lambda k: turn[id(ordered[k][0].request)])
        else:
            return [], due_s - now_s
        size = self._batch_size(ordered[key])
        batch = ordered[key][:size]
        taken = {id(w) for w in batch}
        self._groups[key] = [w for w in self._groups[key] if id(w) not in taken]
        if not self._groups[key]:
            del self._groups[key]
        for waiting in batch:
            waiting.request.last_batch = self._batches_formed
        self._batches_formed += 1
        return batch, None

    async def _loop(self) -> None:
        while True:
            if len(self._running) >= self.batches_in_flight:
                # A batch is formed only when it can start: sentences arriving meanwhile make it fuller.
                await asyncio.wait(self._running, return_when=asyncio.FIRST_COMPLETED)
                continue
            batch, wait_s = self._next_batch(time.monotonic())
            if not batch:
                if self._closing and not self._groups:
                    if self._running:
                        await asyncio.wait(self._running)
                    return
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), wait_s)
                except TimeoutError:
                    pass
                continue
            if self._on_batch is not None:
                self._on_batch(len(batch))
            task = asyncio.create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[_Waiting]) -> None:
        loop = asyncio.get_running_loop()
        try:
            waveforms = await loop.run_in_executor(self._executor, self._run_batch, [w.job for w in batch])
        except Exception as error:  # the model failed: every request of the batch hears why
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(error)
            return
        for waiting, waveform in zip(batch, waveforms):
            if not waiting.future.done():
                waiting.future.set_result(waveform)


class SentenceScheduler(Protocol):
    """What the speech service needs of a scheduler: whole sentences in, waveforms out."""

    pending: int

    async def start(self) -> None: ...

    def submit(self, job: SentenceJob, request: Hashable | None = None) -> asyncio.Future: ...

    async def close(self) -> None: ...


class SchedulerUnavailableError(ValueError):
    """The served family needs a scheduling strategy its model does not offer."""
