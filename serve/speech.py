"""The speech service: POST /v1/audio/speech, from text to streamed audio.

    router = speech_router(context)   # serve/app.py includes it behind the API key

Text is split into sentences (serve/text_split.py), each sentence goes through the model's own
frontend, and the sentences run on the batcher (serve/batching.py) or, for families that stream
by decoder frames on an engine that offers it, as decoder windows (serve/streaming.py). What a
request may set besides the text follows the served family's capabilities: its sampling options
(``family.sampling_type.option_names()``), a style prompt or emotion (``prompt_style``) and an
uploaded reference voice (``zero_shot``); anything else answers 400 naming the family.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import re
import secrets
import threading
import time
from typing import AsyncIterator

import numpy as np
from fastapi import APIRouter
from fastapi.responses import Response, StreamingResponse

from models.interface import UnspeakableTextError, VoiceCondition
from models.sampling import Sampling
from serve.audio_format import MEDIA_TYPES, encode_file, pcm16_bytes, wav_header
from serve.batching import BatchBudget, SentenceJob
from serve.context import ERROR_RESPONSES, ServeContext
from serve.engines import ServedModel
from serve.errors import ApiError
from serve.schemas import SpeechRequest
from serve.settings import ServeSettings
from serve.streaming import decoder_chunks, iterate_blocking, sse_stream
from serve.text_split import split_text

log = logging.getLogger(__name__)

SAMPLING_FIELDS = ("noise_scale", "noise_scale_w")  # request fields that are options of a family's sampling type
EXPRESSIVE_FIELDS = ("emotion", "prompt", "instructions")  # for families with capabilities.prompt_style

# Frontends may keep global state (espeak-ng does): one text-to-utterances call at a time per process.
FRONTEND_LOCK = threading.Lock()

# Bucketed engines: each text bucket also runs slower and faster than the voice's own pace, so the
# frame buckets either side of its usual one are captured too.
WARMUP_LENGTH_SCALES = (0.8, 1.0, 1.25)


class RequestTimeout(Exception):
    """A speech request ran past ``serve.request_timeout_s``."""


def looks_like_path(value: str) -> bool:
    """A file path or URL (``/x``, ``..\\x``, ``~/x``, ``C:x``, ``file:x``, ``s3://x``): never opened, refused."""
    return (any(mark in value for mark in ("/", "\\", "..", "~")) or value.startswith(".")
            or re.match(r"^[A-Za-z]:", value) is not None or value.lower().startswith("file:"))


def batch_budget(served: ServedModel, settings: ServeSettings) -> BatchBudget:
    """``serve.max_batch_phonemes`` over the shapes the served engine really runs: a bucketed torch
    engine pads rows to the batch buckets and phoneme ids to its text buckets; onnxruntime and the
    eager engine run the batch as it is."""
    if not served.text_buckets:
        return BatchBudget(settings.max_batch_phonemes)
    return BatchBudget(settings.max_batch_phonemes, settings.batch_buckets, served.text_buckets)


def warmup_batches(served: ServedModel, settings: ServeSettings) -> list[list[SentenceJob]]:
    """The batches run before the server says ready: every shape it should not meet first under load.

    Only batches the batcher could form: within ``serve.max_batch_phonemes`` (``batch_budget``).
    onnxruntime and the eager engine: one batch per length bucket, as many rows as fit, each
    sentence exactly as long as the bucket's bound. A bucketed engine that replays CUDA graphs
    (``captures_graphs``: cuda_graphs and compile on a GPU) captures one per (batch bucket, text
    bucket, frame bucket), and a shape first met under load stalls its batch while it is captured
    (P99 of 1.4-1.8 s in the H200 load test). So it gets a batch of every batch bucket for every one
    of its own text buckets up to the longest length bucket, at each of WARMUP_LENGTH_SCALES. Other
    bucketed engines (aoti, or any on the CPU) capture nothing: every batch bucket at every length
    bucket."""
    with FRONTEND_LOCK:
        phoneme_ids = served.model.text_to_utterances("Warm up the voice.")[0].phoneme_ids

    def sentence(length: int, length_scale: float = 1.0) -> SentenceJob:
        return SentenceJob(tuple(itertools.islice(itertools.cycle(phoneme_ids), length)),
                           served.family.sampling(length_scale=length_scale))

    budget = batch_budget(served, settings)
    if not served.text_buckets:
        largest = [max(rows for rows in range(1, settings.max_batch_size + 1) if budget.fits(rows, bound, 1.0))
                   for bound in settings.length_buckets]
        return [[sentence(bound)] * rows for bound, rows in zip(settings.length_buckets, largest)]
    if not served.captures_graphs:
        return [[sentence(bound)] * size for bound in settings.length_buckets for size in settings.batch_buckets
                if budget.fits(size, bound, 1.0)]
    longest = settings.length_buckets[-1]
    text_buckets = [bound for bound in served.text_buckets if bound <= longest] or [served.text_buckets[0]]
    # Largest first: the first capture sizes the graphs' shared memory pool, and every smaller shape
    # after it reuses those blocks (on the H200 the pool stayed at the first capture's 23.6 GiB
    # through a dozen more). In the other order, each larger capture needs blocks the pool lacks.
    return [[sentence(bound, scale)] * size for bound in reversed(text_buckets)
            for scale in reversed(WARMUP_LENGTH_SCALES) for size in reversed(settings.batch_buckets)
            if budget.fits(size, bound, scale)]


def speech_router(context: ServeContext) -> APIRouter:
    settings, served, state, metrics = context.settings, context.served, context.state, context.metrics
    family, capabilities = served.family, served.capabilities
    use_decoder_chunks = settings.streaming == "decoder_chunks" and served.decoder_streaming
    router = APIRouter()

    def check_model(model: str) -> None:
        if looks_like_path(model):
            raise ApiError(400, "model must be a model id, not a path: this server never opens client-given files",
                           "path_not_allowed", param="model")
        if model not in context.model_ids:
            raise ApiError(404, f"model {model!r} is not served here; use one of {list(context.model_ids)}",
                           "model_not_found", param="model")

    def check_voice(voice: str) -> None:
        if voice in context.builtin_voices:
            return
        if voice in state.uploaded_voices:
            if not capabilities.zero_shot:
                raise ApiError(400, f"family {family.name} does not support zero-shot voices: {voice!r} is stored "
                                    f"but cannot be spoken; use one of {list(context.builtin_voices)}",
                               "zero_shot_unsupported", param="voice")
            if not state.uploaded_voices[voice].usable:
                raise ApiError(400, f"voice {voice!r} cannot be spoken: {state.uploaded_voices[voice].note}",
                               "transcript_required", param="voice")
            return
        if looks_like_path(voice):
            raise ApiError(400, "voice must be a voice id from GET /v1/voices, not a path: this server never "
                                "opens client-given files", "path_not_allowed", param="voice")
        raise ApiError(400, f"unknown voice {voice!r}; GET /v1/voices lists them: {list(context.builtin_voices)} "
                            "and uploads", "unknown_voice", param="voice")

    def request_sampling(body: SpeechRequest) -> Sampling:
        """The family's sampling at the request's pace and options (seed set per sentence later)."""
        options = {name: getattr(body, name) for name in SAMPLING_FIELDS if getattr(body, name) is not None}
        accepted = family.sampling_type.option_names()
        for name in options:
            if name not in accepted:
                raise ApiError(400, f"family {family.name} takes no {name}: its sampling options are "
                                    f"{list(accepted)}", "unsupported_parameter", param=name)
        return family.sampling(length_scale=1.0 / body.speed, **options)

    def request_voice(body: SpeechRequest, voice: str) -> tuple[VoiceCondition | None, tuple]:
        """(the conditioning the request asks for, a key naming it for the batcher)."""
        given = [name for name in EXPRESSIVE_FIELDS if getattr(body, name) is not None]
        if given and not capabilities.prompt_style:
            raise ApiError(400, f"family {family.name} takes no {given[0]}: leave it out (families with style "
                                "prompts use it)", "unsupported_parameter", param=given[0])
        if body.prompt is not None and body.instructions is not None:
            raise ApiError(400, "instructions is OpenAI's name for prompt: give one of them, not both",
                           "conflicting_parameters", param="instructions")
        prompt = body.prompt if body.prompt is not None else body.instructions
        reference = state.reference_clips.get(voice) if voice in state.uploaded_voices else None
        condition = VoiceCondition(reference=reference, prompt=prompt, emotion=body.emotion)
        if not condition.given():
            return None, ()
        return condition, (voice if reference is not None else None, prompt, body.emotion)

    def phonemize(text: str) -> list[tuple[int, ...]]:
        """Phoneme ids of every sentence of ``text``, pieces capped at ``max_sentence_chars``."""
        pieces = [piece for piece in split_text(text, settings.max_sentence_chars) if any(c.isalnum() for c in piece)]
        with FRONTEND_LOCK:
            sequences = [seq.phoneme_ids for piece in pieces for seq in served.model.text_to_utterances(piece)]
        if not sequences:
            raise UnspeakableTextError(f"no words to speak in {text[:60]!r}")
        return sequences

    async def audio_chunks(jobs: list[SentenceJob]) -> AsyncIterator[np.ndarray]:
        """Waveform pieces (T,) float32 in order: decoder windows, or whole sentences from the batcher."""
        if use_decoder_chunks:
            for job in jobs:
                chunks = decoder_chunks(served.model, job, served.noise_channels, settings.decoder_chunk_frames,
                                        settings.decoder_context_frames)
                async for chunk in iterate_blocking(chunks, state.executor):
                    yield chunk
            return
        futures = [state.batcher.submit(job) for job in jobs]
        try:
            for future in futures:
                yield await future
        finally:  # a request that gave up (timeout, disconnect) takes its sentences out of the queue
            for future in futures:
                future.cancel()

    async def with_deadline(chunks: AsyncIterator[np.ndarray], deadline_s: float) -> AsyncIterator[np.ndarray]:
        try:
            while True:
                remaining_s = deadline_s - time.monotonic()
                try:
                    yield await asyncio.wait_for(anext(chunks), max(remaining_s, 0.0))
                except StopAsyncIteration:
                    return
                except asyncio.TimeoutError as error:
                    raise RequestTimeout(f"no audio within serve.request_timeout_s={settings.request_timeout_s:g} s") \
                        from error
        finally:
            await chunks.aclose()

    @router.post("/v1/audio/speech", responses={
        200: {"description": "Audio in the requested format, or server-sent events for stream_format=sse.",
              "content": {"audio/wav": {}, "audio/pcm": {}, "audio/flac": {}, "text/event-stream": {}}},
        **ERROR_RESPONSES}, response_class=Response, summary="Speak text (OpenAI-compatible)")
    async def create_speech(body: SpeechRequest):
        """Speak ``input``. 503 + Retry-After when the queue is full, warming up or shutting down; 504 past
        ``serve.request_timeout_s`` before the first audio (a stream cut later ends without its final chunk)."""
        started_s = time.perf_counter()
        if state.shutting_down:
            raise context.refuse("shutting_down", "the server is shutting down; retry on another instance")
        if not state.ready:
            raise context.refuse("warming_up", state.warmup_error or "the server is warming up; retry shortly")
        check_model(body.model)
        voice = body.voice if isinstance(body.voice, str) else body.voice.id
        check_voice(voice)
        condition, voice_key = request_voice(body, voice)
        sampling = request_sampling(body)
        if body.stream_format == "sse" and body.response_format == "flac":
            raise ApiError(400, "stream_format sse carries wav or pcm; flac is sent whole with stream_format audio",
                           "unsupported_format", param="response_format")
        if len(body.input) > settings.max_input_chars:
            raise ApiError(400, f"input has {len(body.input)} characters; the limit is {settings.max_input_chars}: "
                                "split it into several requests", "input_too_long", param="input")
        if state.admitted >= settings.queue_capacity:
            raise context.refuse("queue_full", f"the server holds {settings.queue_capacity} requests "
                                               "(serve.queue_capacity); retry after the Retry-After delay")
        state.admitted += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                state.admitted -= 1

        try:
            try:
                sentences = await asyncio.to_thread(phonemize, body.input)
            except UnspeakableTextError as error:
                raise ApiError(400, f"input cannot be spoken by this voice: {error}", "unspeakable_text",
                               param="input") from error
            seed = body.seed if body.seed is not None else settings.default_seed
            seed = secrets.randbelow(2**31) if seed is None else seed
            jobs = [SentenceJob(ids, dataclasses.replace(sampling, seed=seed + index), voice=condition,
                                voice_key=voice_key) for index, ids in enumerate(sentences)]
            chunks = with_deadline(audio_chunks(jobs), time.monotonic() + settings.request_timeout_s)
            try:
                first = await anext(chunks)
            except RequestTimeout as error:
                raise ApiError(504, str(error), "request_timeout", "server_error") from error
            metrics.time_to_first_audio_s.observe(time.perf_counter() - started_s)
        except BaseException:
            release()
            raise
        sample_rate_hz = served.model.sample_rate_hz
        headers = {"X-Sample-Rate": str(sample_rate_hz), "X-Model": served.model_id}
        usage = {"input_tokens": sum(len(job.phoneme_ids) for job in jobs)}

        async def waveforms() -> AsyncIterator[np.ndarray]:
            samples = 0
            try:
                yield first
                samples += first.shape[0]
                async for chunk in chunks:
                    samples += chunk.shape[0]
                    yield chunk
                metrics.speech_latency_s.observe(time.perf_counter() - started_s)
            except RequestTimeout:
                log.warning("speech request cut mid-stream after %.1f s", time.perf_counter() - started_s)
                raise
            finally:
                metrics.audio_seconds.inc(samples / sample_rate_hz)
                usage["output_tokens"] = samples
                usage["total_tokens"] = usage["input_tokens"] + samples
                await chunks.aclose()
                release()

        if body.response_format == "flac":
            try:
                waveform = np.concatenate([chunk async for chunk in waveforms()])
            except RequestTimeout as error:
                raise ApiError(504, str(error), "request_timeout", "server_error") from error
            return Response(encode_file(waveform, sample_rate_hz, "flac"), media_type=MEDIA_TYPES["flac"],
                            headers=headers)

        async def audio_bytes() -> AsyncIterator[bytes]:
            if body.response_format == "wav":
                yield wav_header(sample_rate_hz)
            async for chunk in waveforms():
                yield pcm16_bytes(chunk)

        if body.stream_format == "sse":
            return StreamingResponse(sse_stream(audio_bytes(), usage), media_type="text/event-stream",
                                     headers=headers)
        return StreamingResponse(audio_bytes(), media_type=MEDIA_TYPES[body.response_format], headers=headers)

    return router
