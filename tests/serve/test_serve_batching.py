"""Dynamic batching (serve/batching.py): a sentence's audio does not depend on its batch.

    python -m pytest -q tests/test_serve_batching.py
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient

from models.interface import SynthesisRequest
from models.sampling import VitsSampling
from serve.app import create_app
from serve.batching import BatchBudget, BatcherClosedError, DynamicBatcher, SentenceJob, synthesize_jobs
from serve_support import serve_settings, served_variant

pytestmark = pytest.mark.slow  # loads the real voice

TEXTS = ["Bring the red kite.", "Is it windy today over the hills and far away?", "Yes."]
# Measured: about 1e-4 at most (float rounding in batched kernels, decoder padding past the last frame).
BATCH_TOLERANCE = 5e-4


@pytest.fixture(scope="module")
def onnx_served():
    return served_variant("original_onnx")


@pytest.fixture(scope="module")
def jobs(onnx_served):
    # The family's default scales: noise on, so seeds matter.
    return [SentenceJob(onnx_served.model.text_to_utterances(text)[0].phoneme_ids, VitsSampling(seed=10 + i))
            for i, text in enumerate(TEXTS)]


def unbatched(served, text: str, job: SentenceJob) -> np.ndarray:
    """The sentence alone, through the plain TTSModel API with its seed: the reference."""
    request = SynthesisRequest.from_utterances(served.model.text_to_utterances(text), sampling=job.sampling)
    return served.model.synthesize(request).waveforms()[0].numpy()


def test_batched_equals_unbatched(onnx_served, jobs):
    references = [unbatched(onnx_served, text, job) for text, job in zip(TEXTS, jobs)]
    batched = synthesize_jobs(onnx_served.model, jobs, onnx_served.noise_channels)
    reversed_batch = synthesize_jobs(onnx_served.model, jobs[::-1], onnx_served.noise_channels)[::-1]
    for reference, ours, other_order in zip(references, batched, reversed_batch):
        assert ours.shape == reference.shape == other_order.shape
        assert np.abs(ours - reference).max() < BATCH_TOLERANCE
        assert np.abs(other_order - reference).max() < BATCH_TOLERANCE
    # The seed matters: another seed gives other audio, so the comparison above is not vacuous.
    other_seed = synthesize_jobs(onnx_served.model, [SentenceJob(jobs[1].phoneme_ids, VitsSampling(seed=99))],
                                 onnx_served.noise_channels)[0]
    length = min(len(other_seed), len(references[1]))
    assert np.abs(other_seed[:length] - references[1][:length]).max() > 0.05


def test_batch_needs_one_sampling(onnx_served, jobs):
    mixed = [jobs[0], SentenceJob(jobs[1].phoneme_ids, VitsSampling(length_scale=2.0, seed=0))]
    with pytest.raises(ValueError, match="shares one sampling"):
        synthesize_jobs(onnx_served.model, mixed, onnx_served.noise_channels)


def _job(length: int, seed: int = 0, length_scale: float = 1.0) -> SentenceJob:
    return SentenceJob(tuple([1] * length), VitsSampling(seed=seed, length_scale=length_scale))


def test_batcher_groups_by_bucket_and_scales():
    batches: list[list[int]] = []

    def run_batch(jobs):  # echoes each job's seed as its "waveform"
        batches.append([job.sampling.seed for job in jobs])
        return [np.array([job.sampling.seed], np.float32) for job in jobs]

    async def scenario():
        batcher = DynamicBatcher(run_batch, max_batch_size=2, max_wait_ms=50, length_buckets=(10, 20),
                                 executor=ThreadPoolExecutor(1))
        await batcher.start()
        futures = [batcher.submit(_job(5, 1)), batcher.submit(_job(15, 2)), batcher.submit(_job(6, 3)),
                   batcher.submit(_job(7, 4, length_scale=0.5)), batcher.submit(_job(30, 5))]
        results = [float((await future)[0]) for future in futures]
        await batcher.close()
        return results

    assert asyncio.run(scenario()) == [1, 2, 3, 4, 5]  # each request gets its own result back
    assert sorted(batches) == [[1, 3], [2], [4], [5]]  # same bucket and scales share a batch


def test_batch_budget_counts_the_shape_the_engine_pads_to():
    exact = BatchBudget(1000)
    assert exact.cost(3, 100, 1.0) == 300 and exact.cost(3, 100, 2.0) == 600
    bucketed = BatchBudget(1000, row_buckets=(1, 2, 4), length_buckets=(64, 128))
    assert bucketed.cost(3, 100, 1.0) == 4 * 128  # rows pad to 4, ids to 128
    assert bucketed.cost(5, 200, 1.0) == 5 * 200  # past the last buckets: as it is
    assert not bucketed.fits(2, 100, 4.0)  # 2 x 128 x 4 = 1024
    assert bucketed.fits(1, 5000, 4.0)  # one sentence always runs


def test_batcher_keeps_each_batch_within_the_budget():
    """Long or slow sentences fill a batch before max_batch_size; the rest wait for the next."""
    batches: list[list[int]] = []

    def run_batch(jobs):
        batches.append([job.sampling.seed for job in jobs])
        return [np.zeros(1, np.float32) for _ in jobs]

    async def scenario():
        batcher = DynamicBatcher(run_batch, max_batch_size=8, max_wait_ms=10_000, length_buckets=(200,),
                                 executor=ThreadPoolExecutor(1), budget=BatchBudget(300))
        await batcher.start()
        futures = [batcher.submit(_job(100, seed)) for seed in range(7)]  # 3 x 100 fit, a 4th would not
        futures += [batcher.submit(_job(100, seed, length_scale=2.0)) for seed in (10, 11)]  # 2 x 100 x 2.0 > 300
        futures.append(batcher.submit(_job(190, 20, length_scale=3.0)))  # over budget alone
        # Batches the budget filled leave at once, without max_wait_ms; the rest run on close.
        await asyncio.wait_for(asyncio.gather(*futures[:6], futures[7]), 5)
        await batcher.close()
        await asyncio.gather(*futures)

    asyncio.run(scenario())
    assert sorted(batches) == [[0, 1, 2], [3, 4, 5], [6], [10], [11], [20]]


def test_batcher_waits_at_most_max_wait_and_drops_cancelled():
    ran: list[list[int]] = []

    async def scenario():
        batcher = DynamicBatcher(lambda jobs: ran.append([j.sampling.seed for j in jobs]) or [np.zeros(1)] * len(jobs),
                                 max_batch_size=8, max_wait_ms=30, length_buckets=(10,),
                                 executor=ThreadPoolExecutor(1))
        await batcher.start()
        gave_up = batcher.submit(_job(3, 1))
        kept = batcher.submit(_job(3, 2))
        gave_up.cancel()
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        await kept
        waited_s = loop.time() - started_s
        await batcher.close()
        with pytest.raises(BatcherClosedError):
            batcher.submit(_job(3, 3))
        return waited_s

    waited_s = asyncio.run(scenario())
    assert ran == [[2]]  # the cancelled sentence never ran
    assert 0.025 <= waited_s < 1.0  # a lone sentence leaves after max_wait_ms, not before


def test_close_runs_what_is_waiting():
    async def scenario():
        batcher = DynamicBatcher(lambda jobs: [np.full(1, j.sampling.seed, np.float32) for j in jobs], max_batch_size=8,
                                 max_wait_ms=10_000, length_buckets=(10,), executor=ThreadPoolExecutor(1))
        await batcher.start()
        futures = [batcher.submit(_job(3, seed)) for seed in range(3)]
        await batcher.close()  # without close these would wait 10 s
        return [float(f.result()[0]) for f in futures]

    assert asyncio.run(scenario()) == [0, 1, 2]


@pytest.mark.parametrize("in_flight", [1, 2])
def test_batches_in_flight_bounds_the_batches_running_at_once(in_flight):
    """Batch 2 starts while batch 1 is still on the executor only when two may be in flight; a
    sentence arriving while every slot is busy waits and joins the next batch."""
    running, most, lock, release = [0], [0], threading.Lock(), threading.Event()

    def run_batch(jobs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(5)
        with lock:
            running[0] -= 1
        return [np.full(1, job.sampling.seed, np.float32) for job in jobs]

    async def scenario():
        batcher = DynamicBatcher(run_batch, max_batch_size=1, max_wait_ms=0, length_buckets=(10,),
                                 executor=ThreadPoolExecutor(2), batches_in_flight=in_flight)
        await batcher.start()
        futures = [batcher.submit(_job(3, seed)) for seed in range(3)]
        await asyncio.sleep(0.2)  # every free slot has taken a batch by now
        started = most[0]
        release.set()
        results = [float((await f)[0]) for f in futures]
        await batcher.close()
        return started, results

    started, results = asyncio.run(scenario())
    assert started == in_flight
    assert results == [0, 1, 2]
    with pytest.raises(ValueError, match="batches_in_flight"):
        DynamicBatcher(run_batch, max_batch_size=1, max_wait_ms=0, length_buckets=(10,),
                       executor=ThreadPoolExecutor(1), batches_in_flight=0)


def test_concurrent_http_requests_batch_and_match_sequential(tmp_path, onnx_served):
    # One bucket for all three texts, so that they can share a batch.
    settings = serve_settings(tmp_path, "serve.max_wait_ms=300", "serve.warmup=false", "serve.length_buckets=[512]")
    app = create_app(settings, onnx_served)
    body = {"model": "original_onnx", "voice": "joe", "response_format": "pcm", "seed": 5}
    with TestClient(app) as client:
        sequential = [client.post("/v1/audio/speech", json={**body, "input": text}).content for text in TEXTS]
        results: dict[int, bytes] = {}

        def speak(index):
            results[index] = client.post("/v1/audio/speech", json={**body, "input": TEXTS[index]}).content

        threads = [threading.Thread(target=speak, args=(i,)) for i in range(len(TEXTS))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        metrics = client.get("/metrics").text
    for index, reference in enumerate(sequential):
        ours, theirs = np.frombuffer(results[index], "<i2"), np.frombuffer(reference, "<i2")
        assert ours.shape == theirs.shape
        assert np.abs(ours.astype(np.int32) - theirs).max() <= BATCH_TOLERANCE * 32767 + 1
    # Three sequential batches of 1, then the concurrent ones shared at least one batch.
    batch_count = float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("tts_batch_size_count")))
    assert 3 < batch_count < 6
