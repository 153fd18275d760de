"""Fair scheduling (serve/batching.py): requests take turns, so a short request does not wait behind
every sentence of a long one.

    python -m pytest -q tests/serve/test_serve_fairness.py
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from models.sampling import VitsSampling
from serve.app import create_app
from serve.batching import DynamicBatcher, SentenceJob
from serve_support import running_server, serve_settings, served_variant

PARAGRAPH = ("The old lighthouse keeper climbed the stairs every evening at dusk. He checked the lamp, wiped the "
             "glass, and wrote a short note in the log. Storms came often in the autumn, and ships passed close "
             "to the rocks. Nobody in the village remembered a night when the light had failed. ")
LONG_INPUT = (PARAGRAPH * 6)[:1500]  # about 20 sentences
SHORT_INPUT = "Please bring the blue cup."  # 5 words: one sentence


def _job(seed: int) -> SentenceJob:
    return SentenceJob((1, 2, 3), VitsSampling(seed=seed))


def test_a_later_short_request_joins_the_next_batch_and_each_request_keeps_its_order():
    batches: list[list[int]] = []
    first_batch_running, release = threading.Event(), threading.Event()

    def run_batch(jobs):  # echoes each job's seed; holds the first batch until the short request is in
        batches.append([job.sampling.seed for job in jobs])
        first_batch_running.set()
        release.wait(5)
        return [np.full(1, job.sampling.seed, np.float32) for job in jobs]

    async def submit_request(batcher, seeds):  # one task per request, as the speech service submits
        futures = [batcher.submit(_job(seed)) for seed in seeds]
        return [float((await future)[0]) for future in futures]

    async def scenario():
        batcher = DynamicBatcher(run_batch, max_batch_size=2, max_wait_ms=0, length_buckets=(10,),
                                 executor=ThreadPoolExecutor(1))
        await batcher.start()
        long_request = asyncio.create_task(submit_request(batcher, range(100, 106)))
        await asyncio.to_thread(first_batch_running.wait, 5)
        short_request = asyncio.create_task(submit_request(batcher, [200]))
        await asyncio.sleep(0.05)  # the short sentence is queued behind four of the long request's
        release.set()
        results = await asyncio.gather(long_request, short_request)
        await batcher.close()
        return results

    long_results, short_results = asyncio.run(scenario())
    assert long_results == [100, 101, 102, 103, 104, 105] and short_results == [200]
    # First-in first-out would have run [102, 103], [104, 105] before the short request's sentence.
    assert batches == [[100, 101], [200, 102], [103, 104], [105]]


def test_round_robin_interleaves_requests_in_arrival_order():
    batches: list[list[int]] = []

    async def scenario():
        batcher = DynamicBatcher(lambda jobs: batches.append([j.sampling.seed for j in jobs]) or
                                 [np.zeros(1, np.float32)] * len(jobs),
                                 max_batch_size=4, max_wait_ms=10_000, length_buckets=(10,),
                                 executor=ThreadPoolExecutor(1))
        await batcher.start()
        futures = [batcher.submit(_job(seed), request="first") for seed in (10, 11, 12)]
        futures += [batcher.submit(_job(seed), request="second") for seed in (20, 21, 22)]
        await asyncio.gather(*futures)
        await batcher.close()

    asyncio.run(scenario())
    assert batches == [[10, 20, 11, 21], [12, 22]]  # each request's next sentence in turn


@pytest.mark.slow  # a real voice over a real server, about 15 s on 2 CPU cores
def test_short_request_is_not_held_behind_long_ones_over_http(tmp_path):
    settings = serve_settings(tmp_path, "serve.warmup=false")
    app = create_app(settings, served_variant("original_onnx"))
    latencies_s: dict[str, float] = {}

    def speak(base_url: str, name: str, text: str) -> None:
        started_s = time.perf_counter()
        response = httpx.post(f"{base_url}/v1/audio/speech", timeout=60,
                              json={"model": "original_onnx", "voice": "joe", "input": text, "response_format": "pcm"})
        assert response.status_code == 200, response.text
        latencies_s[name] = time.perf_counter() - started_s

    with running_server(app) as (_, base_url):
        speak(base_url, "short_alone", SHORT_INPUT)
        long_threads = [threading.Thread(target=speak, args=(base_url, f"long_{k}", LONG_INPUT)) for k in range(2)]
        for thread in long_threads:
            thread.start()
        time.sleep(1.0)  # both long requests are in synthesis
        speak(base_url, "short_under_load", SHORT_INPUT)
        for thread in long_threads:
            thread.join(timeout=60)
    longest_s = max(latencies_s["long_0"], latencies_s["long_1"])
    # Behind both long requests' sentences (first-in first-out) it took about as long as they did.
    assert latencies_s["short_under_load"] < longest_s / 3, latencies_s
