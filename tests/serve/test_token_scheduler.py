"""Token-step scheduling (serve/token_scheduler.py): sentences join and leave the decode batch between
steps, a short sentence is not held by a long one, requests take turns for free rows, a failing
sentence fails alone, and the app serves an autoregressive family through it; a decoder that streams
(``step_chunks``) hands a sentence's first chunk out before it finishes, over HTTP too.

    python -m pytest -q tests/serve/test_token_scheduler.py
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from serve_support import running_server, serve_settings, wait_until

from models.family import Family
from models.interface import (
    Capabilities,
    StreamingTokenStepDecoder,
    SynthesisRequest,
    SynthesisResult,
    TokenStepDecoder,
    Utterance,
)
from models.sampling import AutoregressiveSampling
from serve.app import create_app
from serve.audio_format import wav_header
from serve.batching import SentenceJob
from serve.engines import ServedModel
from serve.token_scheduler import TokenStepScheduler

SAMPLE_RATE_HZ = 16_000
SAMPLES_PER_TOKEN = 10
CAPABILITIES = Capabilities(autoregressive=True, streaming_unit="tokens", durations=False)


class CountingDecoder:
    """A made-up autoregressive model: a sentence of n phoneme ids takes n token steps, and its audio
    is n * SAMPLES_PER_TOKEN samples of its first id / 100. Records what each step decoded."""

    def __init__(self, max_rows: int, step_delay_s: float = 0.0):
        self.max_rows, self.step_delay_s = max_rows, step_delay_s
        self.rows: dict = {}  # key -> [tokens left, first id, tokens]
        self.step_rows: list[tuple] = []

    @property
    def active(self) -> int:
        return len(self.rows)

    def join(self, key, request: SynthesisRequest) -> None:
        if len(self.rows) >= self.max_rows:
            raise ValueError("no free row")
        ids = request.phoneme_ids[0, : int(request.phoneme_lengths[0])]
        if int(ids[0]) == 0:
            raise ValueError("phoneme id 0 is not speakable")
        self.rows[key] = [len(ids), int(ids[0]), 0]

    def step(self):
        time.sleep(self.step_delay_s)
        self.step_rows.append(tuple(sorted(self.rows)))
        finished = []
        for key, row in list(self.rows.items()):
            row[0] -= 1
            row[2] += 1
            if row[0] == 0:
                del self.rows[key]
                samples = row[2] * SAMPLES_PER_TOKEN
                audio = torch.full((1, samples), row[1] / 100)
                finished.append((key, SynthesisResult(audio, torch.tensor([samples]), SAMPLE_RATE_HZ)))
        return finished

    def cancel(self, key) -> None:
        self.rows.pop(key, None)


class ChunkingDecoder(CountingDecoder):
    """``CountingDecoder`` that streams: a chunk of ``CHUNK_TOKENS`` tokens' audio whenever a row has
    decoded that many more, the rest when it finishes. ``gate``: once set to an unset Event, every step
    after a row's first chunk waits for it (audio held mid-sentence)."""

    CHUNK_TOKENS = 10

    def __init__(self, max_rows: int, step_delay_s: float = 0.0):
        super().__init__(max_rows, step_delay_s)
        self.gate: threading.Event | None = None
        self.chunks_made = 0

    def step_chunks(self):
        if self.gate is not None and self.chunks_made and not self.gate.wait(timeout=30):
            raise TimeoutError("the test never opened the gate")
        spoken = {key: row[2] for key, row in self.rows.items()}
        levels = {key: row[1] / 100 for key, row in self.rows.items()}
        finished = {key for key, _ in self.step()}
        chunks = []
        for key, before in spoken.items():
            now = before + 1
            if key in finished:
                rest = now - before // self.CHUNK_TOKENS * self.CHUNK_TOKENS
                chunks.append((key, torch.full((rest * SAMPLES_PER_TOKEN,), levels[key]), True))
            elif now % self.CHUNK_TOKENS == 0:
                self.chunks_made += 1
                chunks.append((key, torch.full((self.CHUNK_TOKENS * SAMPLES_PER_TOKEN,), levels[key]), False))
        return chunks


def _job(length: int, first_id: int = 5) -> SentenceJob:
    return SentenceJob((first_id,) + (1,) * (length - 1), AutoregressiveSampling(seed=0))


async def _with_scheduler(decoder, body, stream_chunks: bool = False):
    scheduler = TokenStepScheduler(decoder, executor=ThreadPoolExecutor(1), stream_chunks=stream_chunks)
    await scheduler.start()
    try:
        return await body(scheduler)
    finally:
        await scheduler.close()


def test_the_decoder_protocol_is_met_by_the_fake():
    assert isinstance(CountingDecoder(2), TokenStepDecoder)


def test_a_short_sentence_leaves_long_before_a_long_one_finishes():
    decoder = CountingDecoder(max_rows=4, step_delay_s=0.001)

    async def body(scheduler):
        long = scheduler.submit(_job(400), request="long")
        await asyncio.sleep(0.02)  # the long sentence is decoding when the short one arrives
        short = scheduler.submit(_job(5, first_id=7), request="short")
        waveform = await short
        assert not long.done()
        return waveform, await long

    short, long = asyncio.run(_with_scheduler(decoder, body))
    assert short.shape == (5 * SAMPLES_PER_TOKEN,) and np.allclose(short, 0.07)
    assert long.shape == (400 * SAMPLES_PER_TOKEN,)
    # the short sentence decoded beside the long one, not after it
    assert max(len(rows) for rows in decoder.step_rows) == 2


def test_free_rows_go_to_the_request_served_least_recently():
    decoder = CountingDecoder(max_rows=1)
    order = []

    async def body(scheduler):
        futures = [scheduler.submit(_job(3), request="a") for _ in range(3)]
        futures.append(scheduler.submit(_job(3, first_id=9), request="b"))
        for index, future in enumerate(futures):
            future.add_done_callback(lambda _, index=index: order.append(index))
        await asyncio.gather(*futures)

    asyncio.run(_with_scheduler(decoder, body))
    assert order.index(3) < order.index(2), f"request b waited behind all of a: {order}"
    assert order.index(0) < order.index(1) < order.index(2)  # a's own order kept


def test_a_bad_sentence_fails_alone_and_a_cancelled_one_frees_its_row():
    decoder = CountingDecoder(max_rows=2)

    async def body(scheduler):
        good = scheduler.submit(_job(20), request="good")
        bad = scheduler.submit(_job(3, first_id=0), request="bad")
        abandoned = scheduler.submit(_job(10_000), request="gone")
        await asyncio.sleep(0.05)
        abandoned.cancel()
        with pytest.raises(ValueError, match="not speakable"):
            await bad
        waveform = await good
        await asyncio.sleep(0.05)
        return waveform

    assert asyncio.run(_with_scheduler(decoder, body)).shape == (20 * SAMPLES_PER_TOKEN,)
    assert decoder.active == 0


class TalkingModel:
    """A TTSModel of an autoregressive made-up family whose step decoder is ``CountingDecoder``."""

    family, sample_rate_hz, hop_length = "talker", SAMPLE_RATE_HZ, SAMPLES_PER_TOKEN
    capabilities, sampling_type = CAPABILITIES, AutoregressiveSampling

    def text_to_utterances(self, text: str) -> list[Utterance]:
        return [Utterance(text, tuple(text), tuple(1 + ord(c) % 50 for c in text))]

    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        raise AssertionError("an autoregressive family is served by token steps, not whole batches")

    def step_decoder(self, max_rows: int) -> CountingDecoder:
        return CountingDecoder(max_rows)

    def parts(self) -> dict:
        return {}

    def replace_part(self, role, module) -> None:
        raise NotImplementedError


def test_the_app_serves_an_autoregressive_family_by_token_steps(tmp_path):
    model = TalkingModel()
    family = Family(name="talker", capabilities=CAPABILITIES, sampling_type=AutoregressiveSampling, part_roles=(),
                    load_teacher=lambda voice, cache_dir: model, tiny_model=lambda seed: model,
                    default_voice="narrator")
    served = ServedModel(model, "talker-variant", family, "torch", "narrator", None)
    with TestClient(create_app(serve_settings(tmp_path, "serve.warmup=false"), served)) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="ready")
        response = client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "narrator",
                                                         "input": "Hello there.", "response_format": "pcm"})
        assert response.status_code == 200, response.text
        assert len(response.content) == 2 * len("Hello there.") * SAMPLES_PER_TOKEN  # 16-bit PCM


def test_a_streaming_scheduler_hands_out_chunks_while_the_sentence_decodes():
    decoder = ChunkingDecoder(max_rows=2, step_delay_s=0.001)
    assert isinstance(decoder, StreamingTokenStepDecoder)

    async def body(scheduler):
        stream = scheduler.submit_stream(_job(95, first_id=7), request="a")
        whole = scheduler.submit(_job(95, first_id=7), request="b")  # still whole, from the same chunks
        chunks = []
        async for chunk in stream:
            if not chunks:
                assert decoder.active == 2  # the first chunk left while both sentences decode
            chunks.append(chunk)
        return chunks, await whole

    chunks, whole = asyncio.run(_with_scheduler(decoder, body, stream_chunks=True))
    assert [chunk.shape[0] for chunk in chunks] == [10 * SAMPLES_PER_TOKEN] * 9 + [5 * SAMPLES_PER_TOKEN]
    np.testing.assert_array_equal(np.concatenate(chunks), whole)
    assert whole.shape == (95 * SAMPLES_PER_TOKEN,) and np.allclose(whole, 0.07)


def test_a_cancelled_stream_frees_its_row_and_a_failed_join_raises_from_the_stream():
    decoder = ChunkingDecoder(max_rows=2)

    async def body(scheduler):
        stream = scheduler.submit_stream(_job(10_000), request="gone")
        await anext(stream)
        stream.cancel()
        with pytest.raises(ValueError, match="not speakable"):
            await anext(scheduler.submit_stream(_job(3, first_id=0), request="bad"))
        await asyncio.sleep(0.05)

    asyncio.run(_with_scheduler(decoder, body, stream_chunks=True))
    assert decoder.active == 0


def test_streaming_needs_a_decoder_that_streams():
    with pytest.raises(ValueError, match="stream_chunks needs a decoder with step_chunks.*CountingDecoder"):
        TokenStepScheduler(CountingDecoder(2), executor=ThreadPoolExecutor(1), stream_chunks=True)

    async def body(scheduler):
        with pytest.raises(ValueError, match="stream_chunks=True"):
            scheduler.submit_stream(_job(3))

    asyncio.run(_with_scheduler(CountingDecoder(2), body))


class StreamingTalkingModel(TalkingModel):
    def __init__(self):
        self.decoder = ChunkingDecoder(1)

    def step_decoder(self, max_rows: int) -> ChunkingDecoder:
        self.decoder = ChunkingDecoder(max_rows)
        self.decoder.gate = threading.Event()
        return self.decoder


def test_the_app_sends_the_first_chunk_of_a_sentence_before_it_finishes_decoding(tmp_path):
    model = StreamingTalkingModel()
    family = Family(name="talker", capabilities=CAPABILITIES, sampling_type=AutoregressiveSampling, part_roles=(),
                    load_teacher=lambda voice, cache_dir: model, tiny_model=lambda seed: model,
                    default_voice="narrator")
    served = ServedModel(model, "talker-variant", family, "torch", "narrator", None)
    settings = serve_settings(tmp_path, "serve.warmup=false", "serve.streaming=decoder_chunks")
    text = "Hello there, a sentence of some forty characters."
    first_bytes = len(wav_header(SAMPLE_RATE_HZ)) + 2 * ChunkingDecoder.CHUNK_TOKENS * SAMPLES_PER_TOKEN
    with running_server(create_app(settings, served)) as (_, url):
        wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, what="ready")
        body = {"model": "tts-1", "voice": "narrator", "input": text, "response_format": "wav"}
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=30) as response:
            assert response.status_code == 200
            received = b""
            stream = response.iter_bytes()
            while len(received) < first_bytes:
                received += next(stream)
            assert model.decoder.active == 1  # the sentence is still decoding, held at the gate
            model.decoder.gate.set()
            received += b"".join(stream)
    assert len(received) == len(wav_header(SAMPLE_RATE_HZ)) + 2 * len(text) * SAMPLES_PER_TOKEN
