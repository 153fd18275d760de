"""The speech service: POST /v1/audio/speech, from text to streamed audio.

    router = speech_router(context)   # serve/app.py includes it behind the API key

Text is split into sentences (serve/text_split.py), each sentence goes through the model's own
frontend, and the sentences run on the batcher (serve/batching.py) or, for families that stream
by decoder frames on an engine that offers it, as decoder windows (serve/streaming.py); with
``serve.streaming=decoder_chunks``, an autoregressive family whose step decoder streams sends
each sentence in token chunks while it decodes (serve/token_scheduler.py). What a
request may set besides the text follows the served family's capabilities: its sampling options
(``family.sampling_type.option_names()``), a style prompt or emotion (``prompt_style``) and an
uploaded reference voice (``zero_shot``); anything else answers 400 naming the family.

Admission counts work, not sockets: a request holds its slot (``serve.queue_capacity`` in all,
``serve.max_requests_per_client`` per API key, or per client address without auth) while its
audio is being made, and gives it back when the last chunk is made, however slowly its client
reads. A producer task fills the response's queue; the response sends it at the client's pace,
and a client that falls more than ``serve.slow_client_grace_s`` behind real time is dropped
(serve/streaming.py). The queue holds at most one request's audio (``max_input_chars`` of text).
Deadlines, from the request's arrival: the first audio within ``serve.first_audio_timeout_s``
(else 504 ``first_audio_timeout``), all of it within ``serve.total_timeout_s`` (else the stream
ends without its final chunk; flac, sent whole, answers 504 ``total_timeout``). Each of these logs
one line, never a traceback. A model error answers 500 ``synthesis_failed`` before the first
audio is sent, and ends the stream without its final chunk after; it is logged once, with its
traceback.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import logging
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from models.interface import UnspeakableTextError, VoiceCondition
from models.sampling import Sampling
from serve.audio_format import MEDIA_TYPES, encode_file, pcm16_bytes, wav_header
from serve.batching import BatchBudget, BatcherClosedError, SentenceJob
from serve.client_limits import client_connection
from serve.context import ERROR_RESPONSES, RETRY_AFTER_S, ServeContext
from serve.engines import ServedModel
from serve.errors import ApiError
from serve.schemas import JsonBodyRoute, SpeechRequest
from serve.settings import ServeSettings
from serve.streaming import (
    PacedAudioResponse,
    decoder_chunks,
    iterate_blocking,
    sse_stream,
)
from serve.text_split import split_text
from serve.token_scheduler import TokenStepScheduler

log = logging.getLogger(__name__)

SAMPLING_FIELDS = ("noise_scale", "noise_scale_w")  # request fields that are options of a family's sampling type
EXPRESSIVE_FIELDS = ("emotion", "prompt", "instructions")  # for families with capabilities.prompt_style

# Frontends may keep global state (espeak-ng does): one text-to-utterances call at a time per process.
FRONTEND_LOCK = threading.Lock()


class SynthesisTimeout(Exception):
    """A speech request's audio was not made in time: its first chunk by ``serve.first_audio_timeout_s``,
    all of it by ``serve.total_timeout_s``."""


SYNTHESIS_DONE = object()  # the producer's last item: every chunk of the request is in the queue


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
    of its own text buckets up to the longest length bucket, at each of serve.warmup_length_scales. An
    engine that runs a batch in length groups (``splits_by_length``) gets each batch of 2 or more rows
    twice: equal rows, and rows of lengths spread up to the bound, whose groups meet the frame buckets
    a batch of mixed sentences meets. Other bucketed engines (aoti, or any on the CPU) capture nothing:
    every batch bucket at every length bucket."""
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

    def batches_of(bound: int, size: int, scale: float) -> list[list[SentenceJob]]:
        equal = [[sentence(bound, scale)] * size]
        if not served.splits_by_length or size < 2:
            return equal
        # Lengths spread evenly up to the bound: the length groups of a batch of mixed sentences each meet
        # their own frame bucket, from the shortest rows' to the longest's. Equal rows meet only the last.
        return equal + [[sentence(max(1, round(bound * (k + 1) / size)), scale) for k in range(size)]]

    # Largest first: the first capture sizes the graphs' shared memory pool, and every smaller shape
    # after it reuses those blocks (on the H200 the pool stayed at the first capture's 23.6 GiB
    # through a dozen more). In the other order, each larger capture needs blocks the pool lacks.
    return [batch for bound in reversed(text_buckets) for scale in sorted(settings.warmup_length_scales, reverse=True)
            for size in reversed(settings.batch_buckets) if budget.fits(size, bound, scale)
            for batch in batches_of(bound, size, scale)]


def capture_shapes_between(served: ServedModel, settings: ServeSettings) -> int:
    """After the warm-up batches: a model that can prepare the shapes lying between those the batches met
    (it has ``complete_warm_up(max_batch)``; a family's engine option turns it on) does so now, since each
    one left would stall a batch under load. Returns how many shapes it prepared."""
    complete_warm_up = getattr(served.model, "complete_warm_up", None)
    return complete_warm_up(settings.max_batch_size) if callable(complete_warm_up) else 0


def speech_router(context: ServeContext) -> APIRouter:
    settings, served, state, metrics = context.settings, context.served, context.state, context.metrics
    family, capabilities = served.family, served.capabilities
    use_decoder_chunks = settings.streaming == "decoder_chunks" and served.decoder_streaming
    router = APIRouter(route_class=JsonBodyRoute)  # the JSON body checked as sent (serve/schemas.py)

    def check_model(model: str) -> None:
        if looks_like_path(model):
            raise ApiError(400, "model must be a model id, not a path: this server never opens client-given files",
                           "path_not_allowed", param="model")
        if model not in context.model_ids:
            raise ApiError(404, f"model {model!r} is not served here; use one of {list(context.model_ids)}",
                           "model_not_found", param="model")

    # A family that names its speakers takes a name, or a row number, as the voice (speaker_row).
    speakers = family.speaker_names(served.model) if family.speaker_names is not None else ()

    def speaker_row(voice: str) -> int | None:
        """The speaker table row ``voice`` names (a name first, then a row number); None: not a speaker."""
        if voice in speakers:
            return speakers.index(voice)
        return int(voice) if voice.isdigit() and int(voice) < len(speakers) else None

    def check_voice(voice: str) -> None:
        if voice in context.builtin_voices or speaker_row(voice) is not None:
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
        speaker_hint = (f", a speaker name (e.g. {list(speakers[:3])}) or a row below {len(speakers)}"
                        if speakers else "")
        raise ApiError(400, f"unknown voice {voice!r}; GET /v1/voices lists them: {list(context.builtin_voices)} "
                            f"and uploads{speaker_hint}", "unknown_voice", param="voice")

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
        if not capabilities.knows_emotion(body.emotion):
            raise ApiError(400, f"family {family.name} knows no emotion {body.emotion!r}: use one of "
                                f"{list(capabilities.emotions)}, or describe the style in prompt",
                           "unsupported_emotion", param="emotion")
        reference = state.reference_clips.get(voice) if voice in state.uploaded_voices else None
        condition = VoiceCondition(reference=reference, prompt=prompt, emotion=body.emotion)
        if not condition.given():
            return None, ()
        return condition, (voice if reference is not None else None, prompt, body.emotion)

    def phonemize(text: str) -> list[tuple[int, ...]]:
        """Phoneme ids of every sentence of ``text``, pieces capped at ``max_sentence_chars``."""
        pieces = [piece for piece in split_text(text, settings.max_sentence_chars) if any(c.isalnum() for c in piece)]
        with FRONTEND_LOCK:
            started_s, started_cpu_s = time.perf_counter(), time.thread_time()
            try:
                sequences = [seq.phoneme_ids for piece in pieces for seq in served.model.text_to_utterances(piece)]
            finally:  # text the front end refuses took its time too
                metrics.frontend_s.observe(time.perf_counter() - started_s)
                metrics.frontend_cpu_s.inc(time.thread_time() - started_cpu_s)
        if not sequences:
            raise UnspeakableTextError(f"no words to speak in {text[:60]!r}")
        return sequences

    async def audio_chunks(jobs: list[SentenceJob]) -> AsyncIterator[np.ndarray]:
        """Waveform pieces (T,) float32 in order: decoder windows, token chunks of sentences still decoding
        (a token-step scheduler that streams), or whole sentences from the batcher."""
        if use_decoder_chunks:
            for job in jobs:
                chunks = decoder_chunks(served.model, job, served.noise_channels, settings.decoder_chunk_frames,
                                        settings.decoder_context_frames)
                async for chunk in iterate_blocking(chunks, state.executor):
                    yield chunk
            return
        request_turn = object()  # this request's sentences take one turn among the requests waiting
        if isinstance(state.batcher, TokenStepScheduler) and state.batcher.streams_chunks:
            streams = [state.batcher.submit_stream(job, request=request_turn) for job in jobs]
            try:
                for stream in streams:
                    async for chunk in stream:
                        yield chunk
            finally:
                for stream in streams:
                    stream.cancel()
            return
        futures = [state.batcher.submit(job, request=request_turn) for job in jobs]
        try:
            for future in futures:
                yield await future
        finally:  # a request that gave up (timeout, disconnect) takes its sentences out of the queue
            for future in futures:
                future.cancel()

    async def with_deadlines(chunks: AsyncIterator[np.ndarray], arrived_s: float) -> AsyncIterator[np.ndarray]:
        """``chunks``, the first by ``first_audio_timeout_s`` and the last by ``total_timeout_s`` after ``arrived_s``."""
        first_deadline_s = arrived_s + settings.first_audio_timeout_s
        total_deadline_s = arrived_s + settings.total_timeout_s
        waiting_for_first = True
        try:
            while True:
                deadline_s = first_deadline_s if waiting_for_first else total_deadline_s
                try:
                    # anext's default ends the stream without raising StopAsyncIteration through wait_for:
                    # that exception's traceback would hold wait_for's frame and task, a cycle per request.
                    chunk = await asyncio.wait_for(anext(chunks, None), max(deadline_s - time.monotonic(), 0.0))
                except TimeoutError:
                    if waiting_for_first:
                        raise SynthesisTimeout("no audio within serve.first_audio_timeout_s="
                                               f"{settings.first_audio_timeout_s:g} s") from None
                    raise SynthesisTimeout(f"audio not complete within serve.total_timeout_s="
                                           f"{settings.total_timeout_s:g} s") from None
                if chunk is None:
                    return
                yield chunk
                waiting_for_first = False
        finally:
            await chunks.aclose()

    def synthesis_failed(error: Exception, started_s: float) -> ApiError:
        """A 500 for a request whose model call raised before any audio was sent, logged once with its
        traceback (the model's fault, not the client's; the client gets the error type, not its text)."""
        metrics.rejected.labels("synthesis_failed").inc()
        log.error("500 synthesis_failed after %.1f s: %s: %s", time.perf_counter() - started_s, type(error).__name__,
                  error, exc_info=error)
        return ApiError(500, f"synthesis failed ({type(error).__name__}); the server log has the details",
                        "synthesis_failed", "server_error")

    admitted_by_client: dict[str, int] = {}

    def client_key(request: Request) -> str:
        """Who a request counts against: its API key when auth is on (hashed: keys stay out of memory dumps
        and logs), else its address. Behind a reverse proxy every client shares the proxy's address."""
        if settings.api_key is not None:
            token = request.headers.get("authorization", "")
            return "key:" + hashlib.sha256(token.encode()).hexdigest()[:16]
        return "address:" + (request.client.host if request.client else "unknown")

    @router.post("/v1/audio/speech", responses={
        200: {"description": "Audio in the requested format, or server-sent events for stream_format=sse.",
              "content": {"audio/wav": {}, "audio/pcm": {}, "audio/flac": {}, "text/event-stream": {}}},
        **ERROR_RESPONSES}, response_class=Response, summary="Speak text (OpenAI-compatible)")
    async def create_speech(body: SpeechRequest, request: Request):
        """Speak ``input``. 503 + Retry-After when the queue is full, warming up or shutting down; 429 + Retry-After
        past ``serve.max_requests_per_client``; 504 ``first_audio_timeout`` with no audio after
        ``serve.first_audio_timeout_s`` (a stream past ``serve.total_timeout_s`` ends without its final chunk)."""
        started_s = time.perf_counter()
        arrived_s = time.monotonic()
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
        client = client_key(request)
        if admitted_by_client.get(client, 0) >= settings.max_requests_per_client:
            metrics.rejected.labels("too_many_requests").inc()
            raise ApiError(429, f"this client already has {settings.max_requests_per_client} speech requests being "
                                "synthesized (serve.max_requests_per_client); retry after the Retry-After delay",
                           "too_many_requests", headers={"Retry-After": RETRY_AFTER_S})
        if state.admitted >= settings.queue_capacity:
            raise context.refuse("queue_full", f"the server holds {settings.queue_capacity} requests "
                                               "(serve.queue_capacity); retry after the Retry-After delay")
        state.admitted += 1
        admitted_by_client[client] = admitted_by_client.get(client, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                state.admitted -= 1
                admitted_by_client[client] -= 1
                if not admitted_by_client[client]:
                    del admitted_by_client[client]

        try:
            try:
                sentences = await asyncio.to_thread(phonemize, body.input)
            except UnspeakableTextError as error:
                raise ApiError(400, f"input cannot be spoken by this voice: {error}", "unspeakable_text",
                               param="input") from error
            seed = body.seed if body.seed is not None else settings.default_seed
            seed = secrets.randbelow(2**31) if seed is None else seed
            speaker = speaker_row(voice)
            jobs = [SentenceJob(ids, dataclasses.replace(sampling, seed=seed + index), speaker, voice=condition,
                                voice_key=voice_key) for index, ids in enumerate(sentences)]
            chunks = with_deadlines(audio_chunks(jobs), arrived_s)
            try:
                first = await anext(chunks)
            except SynthesisTimeout as error:
                metrics.rejected.labels("first_audio_timeout").inc()
                log.info("504 first_audio_timeout: %s", error)
                raise ApiError(504, str(error), "first_audio_timeout", "server_error") from None
            except BatcherClosedError:  # shutdown began while this request was phonemized
                raise context.refuse("shutting_down",
                                     "the server is shutting down; retry on another instance") from None
            except Exception as error:  # the model failed on this request's first sentence
                raise synthesis_failed(error, started_s) from None
            metrics.time_to_first_audio_s.observe(time.perf_counter() - started_s)
        except BaseException:
            release()
            raise
        made: asyncio.Queue = asyncio.Queue()  # unbounded: the producer never waits for the client

        async def produce() -> None:
            try:
                async for chunk in chunks:
                    made.put_nowait(chunk)
                made.put_nowait(SYNTHESIS_DONE)
            except Exception as error:  # handed to the response, which ends the stream
                made.put_nowait(error)
            finally:
                await chunks.aclose()
                release()

        producer = asyncio.create_task(produce(), name="speech-producer")
        producer.add_done_callback(lambda _: release())  # also when cancelled before its first step
        sample_rate_hz = served.model.sample_rate_hz
        headers = {"X-Sample-Rate": str(sample_rate_hz), "X-Model": served.model_id}
        usage = {"input_tokens": sum(len(job.phoneme_ids) for job in jobs)}

        async def waveforms() -> AsyncIterator[np.ndarray]:
            """The request's chunks as the producer makes them; raises what stopped it (``SynthesisTimeout``)."""
            samples = 0
            try:
                chunk = first
                while chunk is not SYNTHESIS_DONE:
                    if isinstance(chunk, BaseException):
                        raise chunk
                    samples += chunk.shape[0]
                    yield chunk
                    chunk = await made.get()
                metrics.speech_latency_s.observe(time.perf_counter() - started_s)
            finally:
                metrics.audio_seconds.inc(samples / sample_rate_hz)
                usage["output_tokens"] = samples
                usage["total_tokens"] = usage["input_tokens"] + samples
                producer.cancel()  # a client gone mid-stream takes its sentences out of the queue

        if body.response_format == "flac":
            try:
                waveform = np.concatenate([chunk async for chunk in waveforms()])
            except SynthesisTimeout as error:
                metrics.rejected.labels("total_timeout").inc()
                log.warning("504 total_timeout: %s", error)
                raise ApiError(504, str(error), "total_timeout", "server_error") from None
            except Exception as error:
                raise synthesis_failed(error, started_s) from None
            encoded = encode_file(waveform, sample_rate_hz, "flac")

            async def whole_file() -> AsyncIterator[bytes]:
                yield encoded

            # One send, paced like a stream: a client that never reads the file is dropped after the grace
            # plus the audio's length, as a stream's would be.
            return PacedAudioResponse(whole_file(), connection=client_connection(request.scope),
                                      bytes_per_audio_s=len(encoded) * sample_rate_hz / max(len(waveform), 1),
                                      grace_s=settings.slow_client_grace_s,
                                      on_slow_reader=metrics.disconnects.labels("slow_reader").inc,
                                      media_type=MEDIA_TYPES["flac"],
                                      headers={**headers, "Content-Length": str(len(encoded))})
        connection = client_connection(request.scope)

        async def audio_bytes() -> AsyncIterator[bytes]:
            if body.response_format == "wav":
                yield wav_header(sample_rate_hz)
            try:
                async for chunk in waveforms():
                    yield pcm16_bytes(chunk)
            except SynthesisTimeout as error:
                metrics.disconnects.labels("total_timeout").inc()
                log.warning("speech stream cut after %.1f s: %s", time.perf_counter() - started_s, error)
                await connection.cut_off()
            except Exception as error:  # the model failed on a later sentence: the stream ends without its end
                metrics.disconnects.labels("synthesis_failed").inc()
                log.error("speech stream cut after %.1f s: synthesis failed: %s: %s", time.perf_counter() - started_s,
                          type(error).__name__, error, exc_info=error)
                await connection.cut_off()

        content, media_type, bytes_per_audio_s = audio_bytes(), MEDIA_TYPES[body.response_format], 2 * sample_rate_hz
        if body.stream_format == "sse":
            content, media_type, bytes_per_audio_s = sse_stream(content, usage), "text/event-stream", \
                bytes_per_audio_s * 4 / 3  # base64 of the same 16-bit samples
        return PacedAudioResponse(content, connection=connection, bytes_per_audio_s=bytes_per_audio_s,
                                  grace_s=settings.slow_client_grace_s,
                                  on_slow_reader=metrics.disconnects.labels("slow_reader").inc,
                                  media_type=media_type, headers=headers)

    return router
