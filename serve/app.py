"""The HTTP server: OpenAI-compatible speech, voices, health, readiness and Prometheus metrics.

    served = load_served_model(settings)         # serve/engines.py
    app = create_app(settings, served)           # then uvicorn.run(app, ...): see serve/__main__.py

Routes: POST /v1/audio/speech, GET /v1/voices, POST /v1/voices, GET /v1/models, GET /healthz,
GET /readyz, GET /metrics, and FastAPI's /openapi.json and /docs. /v1/* take the bearer token
``serve.api_key`` when one is set; health, readiness and metrics never do.

Lifecycle: the model is loaded before the app starts; the app then warms up every length bucket
once on the model thread and only then answers /readyz 200 and takes speech requests (503
``warming_up`` before). On shutdown it refuses new requests (503 ``shutting_down``), lets the
admitted ones finish (up to ``serve.shutdown_grace_s``), runs what the batcher still holds and
stops the model thread.
"""
from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import re
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import numpy as np
from fastapi import Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from models.sampling import VitsSampling
from models.interface import UnspeakableTextError
from serve.audio_format import MEDIA_TYPES, encode_file, pcm16_bytes, wav_header
from serve.batching import BatchBudget, DynamicBatcher, NoiseScales, SentenceJob, synthesize_jobs
from serve.engines import ServedModel, device_memory_note, device_memory_reserved
from serve.errors import ApiError, install_error_handlers
from serve.metrics import RequestMetricsMiddleware, ServeMetrics
from serve.schemas import ErrorBody, SpeechRequest, VoiceList, VoiceObject
from serve.settings import ServeSettings
from serve.speaker_cache import SpeakerCache, content_key, make_speaker_cache
from serve.streaming import decoder_chunks, iterate_blocking, sse_stream
from serve.text_split import split_text
from serve.uploads import TARGET_SAMPLE_RATE_HZ, UploadLimits, UploadRejected, decode_reference

log = logging.getLogger(__name__)

RETRY_AFTER_S = "1"
ZERO_SHOT_FAMILIES: tuple[str, ...] = ()  # families whose models take a reference embedding; none served yet
EXPRESSIVE_FAMILIES: tuple[str, ...] = ()  # families that take emotion / prompt; none served yet
UPLOAD_ID_PREFIX = "voice_"
ERROR_RESPONSES = {status: {"model": ErrorBody} for status in (400, 401, 404, 413, 415, 500, 503, 504)}
VOICE_UPLOAD_PACKAGES = "Resemblyzer and librosa"  # what POST /v1/voices needs beyond the serving wheels


class RequestTimeout(Exception):
    """A speech request ran past ``serve.request_timeout_s``."""


@dataclass
class ServerState:
    ready: bool = False
    warmup_error: str | None = None
    shutting_down: bool = False
    admitted: int = 0  # speech requests waiting or running
    uploaded_voices: dict[str, VoiceObject] = field(default_factory=dict)
    batcher: DynamicBatcher | None = None
    executor: ThreadPoolExecutor | None = None
    speaker_cache: SpeakerCache | None = None


def _looks_like_path(value: str) -> bool:
    """A file path or URL (``/x``, ``..\\x``, ``~/x``, ``C:x``, ``file:x``, ``s3://x``): never opened, refused."""
    return (any(mark in value for mark in ("/", "\\", "..", "~")) or value.startswith(".")
            or re.match(r"^[A-Za-z]:", value) is not None or value.lower().startswith("file:"))


def _speaker_encoder() -> Callable[..., np.ndarray]:
    """``evaluate.speaker.speaker_embedding``, imported on the first upload (about 2 s, off the event loop)."""
    # Lazy: resemblyzer (with librosa, scipy, webrtcvad) and torchmetrics are too heavy for a serving machine,
    # which then answers POST /v1/voices 501 and serves speech as usual.
    import librosa  # noqa: F401  decode_reference resamples with it
    from evaluate.speaker import speaker_embedding
    return speaker_embedding


# espeak-ng, under every Piper frontend, keeps global state: one phonemization at a time per process.
_FRONTEND_LOCK = threading.Lock()


# Bucketed engines: each text bucket also runs slower and faster than the voice's own pace, so the
# frame buckets either side of its usual one are captured too.
WARMUP_LENGTH_SCALES = (0.8, 1.0, 1.25)


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
    with _FRONTEND_LOCK:
        phoneme_ids = served.model.text_to_utterances("Warm up the voice.")[0].phoneme_ids

    def sentence(length: int, length_scale: float = 1.0) -> SentenceJob:
        return SentenceJob(tuple(itertools.islice(itertools.cycle(phoneme_ids), length)),
                           NoiseScales(length_scale=length_scale))

    budget = batch_budget(served, settings)
    if not served.engine.startswith("torch_"):
        largest = [max(rows for rows in range(1, settings.max_batch_size + 1) if budget.fits(rows, bound, 1.0))
                   for bound in settings.length_buckets]
        return [[sentence(bound)] * rows for bound, rows in zip(settings.length_buckets, largest)]
    if not served.captures_graphs:
        return [[sentence(bound)] * size for bound in settings.length_buckets for size in settings.batch_buckets
                if budget.fits(size, bound, 1.0)]
    from models.piper.engines import TEXT_BUCKETS

    longest = settings.length_buckets[-1]
    text_buckets = [bound for bound in TEXT_BUCKETS if bound <= longest] or [TEXT_BUCKETS[0]]
    # Largest first: the first capture sizes the graphs' shared memory pool, and every smaller shape
    # after it reuses those blocks (on the H200 the pool stayed at the first capture's 23.6 GiB
    # through a dozen more). In the other order, each larger capture needs blocks the pool lacks.
    return [[sentence(bound, scale)] * size for bound in reversed(text_buckets)
            for scale in reversed(WARMUP_LENGTH_SCALES) for size in reversed(settings.batch_buckets)
            if budget.fits(size, bound, scale)]


def batch_budget(served: ServedModel, settings: ServeSettings) -> BatchBudget:
    """``serve.max_batch_phonemes`` over the shapes the served engine really runs: a bucketed torch
    engine pads rows to the batch buckets and phoneme ids to its text buckets; onnxruntime and the
    eager engine run the batch as it is."""
    if not served.engine.startswith("torch_"):
        return BatchBudget(settings.max_batch_phonemes)
    from models.piper.engines import TEXT_BUCKETS

    return BatchBudget(settings.max_batch_phonemes, settings.batch_buckets, TEXT_BUCKETS)


def create_app(settings: ServeSettings, served: ServedModel, warm_up_before_serving: bool = False) -> FastAPI:
    """The HTTP app over ``served``. It warms up in the background by default: /healthz answers and
    /readyz says 503 until the model is warm. ``warm_up_before_serving``: warm up inside the lifespan's
    start instead, so uvicorn accepts no connection before the model is warm. Workers sharing one
    port (serve.workers > 1) need that: a client or probe cannot choose which worker answers, and a
    worker still warming would take its share of requests only to refuse them with 503."""
    metrics = ServeMetrics()
    state = ServerState()
    limits = UploadLimits(settings.max_upload_bytes, settings.max_upload_s, settings.min_upload_s,
                          settings.min_upload_sample_rate_hz, settings.max_upload_sample_rate_hz)
    model_ids = (served.model_id, *settings.model_aliases)
    builtin_voices = (served.voice_name, *settings.voice_aliases)
    use_decoder_chunks = settings.streaming == "decoder_chunks" and served.decoder_streaming
    if settings.streaming == "decoder_chunks" and not served.decoder_streaming:
        log.warning("serve.streaming=decoder_chunks needs the torch engine; %s runs %s: streaming by sentence",
                    served.model_id, served.engine)

    if served.noise_device.startswith("cuda"):
        metrics.device_memory.set_function(lambda: device_memory_reserved(served.noise_device))

    def run_batch(jobs: list[SentenceJob]) -> list[np.ndarray]:
        return synthesize_jobs(served.model, jobs, served.latent_channels, served.noise_device)

    def warm_up() -> None:
        batches = warmup_batches(served, settings)
        for batch in batches:
            run_batch(batch)
        if use_decoder_chunks:
            for _ in decoder_chunks(served.model, batches[0][0], served.latent_channels,
                                    settings.decoder_chunk_frames, settings.decoder_context_frames):
                pass

    async def run_warm_up() -> None:
        started_s = time.perf_counter()
        try:
            if settings.warmup:
                await asyncio.get_running_loop().run_in_executor(state.executor, warm_up)
        except Exception as error:  # the model cannot run its own shapes: stay unready, say why
            log.exception("warm-up failed")
            state.warmup_error = f"warm-up failed: {type(error).__name__}: {error}"
            return
        state.ready = True
        log.info("ready: %s (%s, %s) warmed up in %.1f s%s", served.model_id, served.engine, served.note or "named",
                 time.perf_counter() - started_s, device_memory_note(served.noise_device))

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        state.executor = ThreadPoolExecutor(max_workers=settings.batches_in_flight, thread_name_prefix="tts-model")
        state.batcher = DynamicBatcher(run_batch, max_batch_size=settings.max_batch_size,
                                       max_wait_ms=settings.max_wait_ms, length_buckets=settings.length_buckets,
                                       executor=state.executor, on_batch=metrics.batch_size.observe,
                                       batches_in_flight=settings.batches_in_flight,
                                       budget=batch_budget(served, settings))
        await state.batcher.start()
        metrics.queue_depth.set_function(lambda: state.batcher.pending)
        metrics.admitted.set_function(lambda: state.admitted)
        state.speaker_cache = make_speaker_cache(settings.speaker_cache_entries, settings.speaker_cache_ttl_s,
                                                 settings.redis_url)
        warm_up_task = asyncio.create_task(run_warm_up(), name="warm-up")
        if warm_up_before_serving:
            await warm_up_task
        try:
            yield
        finally:
            state.shutting_down = True
            deadline_s = time.monotonic() + settings.shutdown_grace_s
            while state.admitted > 0 and time.monotonic() < deadline_s:
                await asyncio.sleep(0.02)
            if state.admitted:
                log.warning("shutdown: %d requests still running after %.0f s", state.admitted,
                            settings.shutdown_grace_s)
            await warm_up_task
            await state.batcher.close()
            state.executor.shutdown(wait=True)

    app = FastAPI(
        title="tts-compress speech server",
        version="1",
        lifespan=lifespan,
        description=("OpenAI-compatible text to speech for the champion variant (or a named one). "
                     "Errors are `{\"error\": {\"message\", \"type\", \"code\", \"param\"}}`."),
    )
    install_error_handlers(app)
    bearer = HTTPBearer(auto_error=False, description="`serve.api_key`, when set (env TTS_SERVE_API_KEY).")

    async def require_api_key(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if settings.api_key is None:
            return
        if credentials is None or not hmac.compare_digest(credentials.credentials.encode(),
                                                          settings.api_key.encode()):
            raise ApiError(401, "missing or wrong bearer token: send `Authorization: Bearer <serve.api_key>`",
                           "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)

    def refuse(reason: str, message: str) -> ApiError:
        metrics.rejected.labels(reason).inc()
        return ApiError(503, message, reason, "server_error", headers={"Retry-After": RETRY_AFTER_S})

    def check_model(model: str) -> None:
        if _looks_like_path(model):
            raise ApiError(400, "model must be a model id, not a path: this server never opens client-given files",
                           "path_not_allowed", param="model")
        if model not in model_ids:
            raise ApiError(404, f"model {model!r} is not served here; use one of {list(model_ids)}",
                           "model_not_found", param="model")

    def check_voice(voice: str) -> None:
        if voice in builtin_voices:
            return
        if voice in state.uploaded_voices and served.family not in ZERO_SHOT_FAMILIES:
            raise ApiError(400, f"family {served.family} does not support zero-shot voices: {voice!r} is stored "
                                f"but cannot be spoken; use one of {list(builtin_voices)}",
                           "zero_shot_unsupported", param="voice")
        if _looks_like_path(voice):
            raise ApiError(400, "voice must be a voice id from GET /v1/voices, not a path: this server never "
                                "opens client-given files", "path_not_allowed", param="voice")
        raise ApiError(400, f"unknown voice {voice!r}; GET /v1/voices lists them: {list(builtin_voices)} and uploads",
                       "unknown_voice", param="voice")

    def check_expressive_fields(body: SpeechRequest) -> None:
        if served.family in EXPRESSIVE_FAMILIES:
            return
        for name in ("emotion", "prompt", "instructions"):
            if getattr(body, name) is not None:
                raise ApiError(400, f"family {served.family} takes no {name}: leave it out (expressive families "
                                    "such as EmotiVoice use it)", "unsupported_parameter", param=name)

    def phonemize(text: str) -> list[tuple[int, ...]]:
        """Phoneme ids of every sentence of ``text``, pieces capped at ``max_sentence_chars``."""
        pieces = [piece for piece in split_text(text, settings.max_sentence_chars) if any(c.isalnum() for c in piece)]
        with _FRONTEND_LOCK:
            sequences = [seq.phoneme_ids for piece in pieces for seq in served.model.text_to_utterances(piece)]
        if not sequences:
            raise UnspeakableTextError(f"no words to speak in {text[:60]!r}")
        return sequences

    async def audio_chunks(jobs: list[SentenceJob]) -> AsyncIterator[np.ndarray]:
        """Waveform pieces (T,) float32 in order: decoder windows, or whole sentences from the batcher."""
        if use_decoder_chunks:
            for job in jobs:
                chunks = decoder_chunks(served.model, job, served.latent_channels, settings.decoder_chunk_frames,
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

    @app.post("/v1/audio/speech", dependencies=[Depends(require_api_key)], responses={
        200: {"description": "Audio in the requested format, or server-sent events for stream_format=sse.",
              "content": {"audio/wav": {}, "audio/pcm": {}, "audio/flac": {}, "text/event-stream": {}}},
        **ERROR_RESPONSES}, response_class=Response, summary="Speak text (OpenAI-compatible)")
    async def create_speech(body: SpeechRequest):
        """Speak ``input``. 503 + Retry-After when the queue is full, warming up or shutting down; 504 past
        ``serve.request_timeout_s`` before the first audio (a stream cut later ends without its final chunk)."""
        started_s = time.perf_counter()
        if state.shutting_down:
            raise refuse("shutting_down", "the server is shutting down; retry on another instance")
        if not state.ready:
            raise refuse("warming_up", state.warmup_error or "the server is warming up; retry shortly")
        check_model(body.model)
        check_voice(body.voice if isinstance(body.voice, str) else body.voice.id)
        check_expressive_fields(body)
        if body.stream_format == "sse" and body.response_format == "flac":
            raise ApiError(400, "stream_format sse carries wav or pcm; flac is sent whole with stream_format audio",
                           "unsupported_format", param="response_format")
        if len(body.input) > settings.max_input_chars:
            raise ApiError(400, f"input has {len(body.input)} characters; the limit is {settings.max_input_chars}: "
                                "split it into several requests", "input_too_long", param="input")
        if state.admitted >= settings.queue_capacity:
            raise refuse("queue_full", f"the server holds {settings.queue_capacity} requests (serve.queue_capacity); "
                                       "retry after the Retry-After delay")
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
            defaults = VitsSampling()
            scales = NoiseScales(noise_scale=defaults.noise_scale if body.noise_scale is None else body.noise_scale,
                                 length_scale=1.0 / body.speed,
                                 noise_scale_w=defaults.noise_scale_w if body.noise_scale_w is None
                                 else body.noise_scale_w)
            seed = body.seed if body.seed is not None else settings.default_seed
            seed = secrets.randbelow(2**31) if seed is None else seed
            jobs = [SentenceJob(ids, scales, seed + index) for index, ids in enumerate(sentences)]
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

    def builtin_voice() -> VoiceObject:
        return VoiceObject(id=served.voice_name, kind="builtin", name=served.voice_name, model=served.model_id,
                           usable=True, aliases=list(settings.voice_aliases))

    @app.get("/v1/voices", response_model=VoiceList, dependencies=[Depends(require_api_key)],
             responses=ERROR_RESPONSES, summary="Voices of the served model and uploaded references")
    async def list_voices() -> VoiceList:
        return VoiceList(data=[builtin_voice(), *state.uploaded_voices.values()])

    @app.post("/v1/voices", response_model=VoiceObject, status_code=201, dependencies=[Depends(require_api_key)],
              responses={**ERROR_RESPONSES, 501: {"model": ErrorBody}},
              summary="Upload a reference clip (zero-shot voice)")
    async def upload_voice(request: Request,
                           file: UploadFile = File(..., description=(
                               "The clip's bytes as a multipart file (WAV, FLAC or OGG; 1-30 s of speech, "
                               "16-48 kHz). Server-side paths and URLs are not accepted.")),
                           name: str = Form("", max_length=200, description="A label for the voice.")) -> VoiceObject:
        """Decode and check the clip, compute its speaker embedding (resemblyzer, cached by sha256 of the
        bytes) and store it as ``voice_<hash>``. The piper family has no zero-shot voice: the voice is stored
        and listed with ``usable: false``, and speech with it answers 400 ``zero_shot_unsupported``. A server
        without resemblyzer and librosa answers 501 ``voice_upload_unavailable``."""
        declared_bytes = int(request.headers.get("content-length") or 0)
        if declared_bytes > settings.max_upload_bytes + 64_000:  # room for the multipart framing
            raise ApiError(413, f"the upload is {declared_bytes} bytes; the limit is {settings.max_upload_bytes}",
                           "upload_too_large")
        try:
            speaker_embedding = await asyncio.to_thread(_speaker_encoder)
        except ModuleNotFoundError as error:
            raise ApiError(501, f"voice uploads need the Python package {error.name!r}, which this server lacks: "
                                f"install {VOICE_UPLOAD_PACKAGES} to take reference clips",
                           "voice_upload_unavailable", "server_error") from error
        data = await file.read(settings.max_upload_bytes + 1)
        try:
            clip = await asyncio.to_thread(decode_reference, data, limits)
        except UploadRejected as error:
            raise ApiError(error.status_code, str(error), error.code, param="file") from error
        key = content_key(data)
        embedding = await asyncio.to_thread(state.speaker_cache.get, key)
        cached = embedding is not None
        metrics.speaker_cache.labels("hit" if cached else "miss").inc()
        if not cached:
            try:
                embedding = await asyncio.to_thread(speaker_embedding, clip.waveform, TARGET_SAMPLE_RATE_HZ, "file")
            except ValueError as error:
                raise ApiError(400, str(error), "no_speech", param="file") from error
            await asyncio.to_thread(state.speaker_cache.put, key, embedding)
        voice_id = UPLOAD_ID_PREFIX + key[:24]
        usable = served.family in ZERO_SHOT_FAMILIES
        voice = VoiceObject(
            id=voice_id, kind="reference", name=name or voice_id, model=served.model_id, usable=usable,
            note="" if usable else f"family {served.family} does not support zero-shot voices",
            sha256=key, duration_s=round(clip.duration_s, 3), sample_rate_hz=clip.source_sample_rate_hz,
            created_at=int(time.time()), embedding_cached=cached)
        state.uploaded_voices[voice_id] = voice
        return voice

    @app.get("/v1/models", dependencies=[Depends(require_api_key)], responses=ERROR_RESPONSES,
             summary="The served model and its aliases")
    async def list_models() -> dict:
        return {"object": "list", "data": [
            {"id": model_id, "object": "model", "owned_by": "tts-compress", "engine": served.engine,
             "family": served.family, "variant": served.model_id} for model_id in model_ids]}

    @app.get("/healthz", summary="Liveness: the process answers")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz", summary="Readiness: warmed up and taking requests", responses={503: {"model": ErrorBody}})
    async def readyz():
        if state.ready and not state.shutting_down:
            return {"status": "ready", "model": served.model_id, "engine": served.engine}
        reason = "shutting_down" if state.shutting_down else "warming_up"
        return JSONResponse({"error": {"message": state.warmup_error or reason.replace("_", " "), "type": "server_error",
                                       "code": reason, "param": None}},
                            status_code=503, headers={"Retry-After": RETRY_AFTER_S})

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.state.serve = state
    app.state.metrics = metrics
    return app
