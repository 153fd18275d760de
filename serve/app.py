"""The HTTP server: OpenAI-compatible speech, voices, health, readiness and Prometheus metrics.

    served = load_served_model(settings)         # serve/engines.py
    app = create_app(settings, served)           # then uvicorn.run(app, ...): see serve/__main__.py

This module wires the routes together; each lives in its own module: POST /v1/audio/speech in
serve/speech.py (the speech service), GET/POST /v1/voices and GET /v1/models in serve/voices.py,
GET /healthz, /readyz and /metrics in serve/health.py, and FastAPI's /openapi.json and /docs.
/v1/* take the bearer token ``serve.api_key`` when one is set; health, readiness and metrics
never do. Every request head is capped and timed by the connection's protocol (serve/http_protocol.py,
through ``uvicorn_options``), every request body by serve/client_limits.py, outside Starlette's own
middleware so that a refusal never reaches a route and a response can drop its connection; outside
both, serve/error_boundary.py logs an unexpected error once.

Lifecycle: the model is loaded before the app starts, and the family's scheduling strategy is
chosen from its capabilities (serve/batching.py: an autoregressive family is refused here). The
app then warms up every length bucket once on the model thread and only then answers /readyz 200
and takes speech requests (503 ``warming_up`` before). On shutdown it refuses new requests (503
``shutting_down``), lets the admitted ones finish (up to ``serve.shutdown_grace_s``), runs what
the batcher still holds and stops the model thread.
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import numpy as np
import torch
from fastapi import Depends, FastAPI
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp

from models.interface import StreamingTokenStepDecoder
from serve.batching import (
    DynamicBatcher,
    SchedulerUnavailableError,
    SentenceJob,
    synthesize_jobs,
)
from serve.client_limits import MULTIPART_FRAMING_BYTES, BodyCap, ClientLimitsMiddleware
from serve.context import ServeContext
from serve.engines import ServedModel, device_memory_note, device_memory_reserved
from serve.error_boundary import ErrorBoundaryMiddleware
from serve.errors import ApiError, install_error_handlers
from serve.gc_pauses import (
    GcPauseRecorder,
    freeze_warm_heap,
    restore_thresholds,
    space_full_collections,
    unfreeze_heap,
)
from serve.health import health_router
from serve.http_protocol import REFUSAL_COUNTER_STATE_KEY, BoundedHeadProtocol
from serve.metrics import RequestMetricsMiddleware
from serve.settings import ServeSettings
from serve.speaker_cache import make_speaker_cache
from serve.speech import batch_budget, capture_shapes_between, speech_router, warmup_batches
from serve.streaming import decoder_chunks
from serve.token_scheduler import TokenStepScheduler
from serve.voices import voices_router

log = logging.getLogger(__name__)

UPLOAD_ROUTE = "/v1/voices"  # the one route whose body is an upload (serve/voices.py), capped by max_upload_bytes


class SpeechServerApp(FastAPI):
    """FastAPI with ``outer_middleware`` around everything, Starlette's error middleware included: it sees
    the server's own ``send`` (the connection a response may drop), which Starlette's stack wraps."""

    outer_middleware = staticmethod(lambda app: app)

    def build_middleware_stack(self) -> ASGIApp:
        return self.outer_middleware(super().build_middleware_stack())


def model_threads(settings: ServeSettings) -> ThreadPoolExecutor:
    """The threads the model runs on, ``serve.batches_in_flight`` of them. On a CPU device each one sets
    torch's intra-op threads to ``serve.torch_threads`` when it starts: OpenMP's thread count is per
    calling thread, and a model thread at torch's default built a second OpenMP team beside the one
    the main thread made while loading. torch also keeps the count as the default of threads that
    first use it later (the front end's ``asyncio.to_thread`` workers); the main thread keeps its own. On this project's 2-core AMD EPYC that made one int8
    (1, 512) x (512, 2048) product 6x slower (11.6 -> 68 us) and GPT-SoVITS's int8 T2S 1.8x slower;
    with one intra-op thread a model thread ran float32 no slower (docs/benchmarks.md, session 54)."""
    if settings.device != "cpu":
        return ThreadPoolExecutor(max_workers=settings.batches_in_flight, thread_name_prefix="tts-model")
    return ThreadPoolExecutor(max_workers=settings.batches_in_flight, thread_name_prefix="tts-model",
                              initializer=torch.set_num_threads, initargs=(settings.torch_threads,))


def uvicorn_options(settings: ServeSettings) -> dict:
    """What the server bounds before a request reaches the app: idle keep-alive connections and open
    connections (uvicorn's own settings), each request head's time and size (serve/http_protocol.py)."""
    protocol = functools.partial(BoundedHeadProtocol, header_read_timeout_s=settings.header_read_timeout_s,
                                 max_header_bytes=settings.max_header_bytes)
    return dict(host=settings.host, port=settings.port, log_level="info", access_log=settings.access_log,
                timeout_graceful_shutdown=int(settings.shutdown_grace_s), http=protocol,
                timeout_keep_alive=settings.keep_alive_timeout_s, limit_concurrency=settings.max_connections)


def _step_decoder_of(served: ServedModel):
    """An autoregressive family's ``step_decoder`` (continuous batching by token step); None for a
    family whose sentence is one model call (sentence batching)."""
    if not served.capabilities.autoregressive:
        return None
    step_decoder = getattr(served.model, "step_decoder", None)
    if not callable(step_decoder):
        raise SchedulerUnavailableError(
            f"family {served.family.name} is autoregressive (capabilities.autoregressive) but its {served.engine} "
            "model offers no step_decoder (models.interface.TokenStepDecoder) for token-step batching")
    return step_decoder


def create_app(settings: ServeSettings, served: ServedModel, warm_up_before_serving: bool = False) -> FastAPI:
    """The HTTP app over ``served``. It warms up in the background by default: /healthz answers and
    /readyz says 503 until the model is warm. ``warm_up_before_serving``: warm up inside the lifespan's
    start instead, so uvicorn accepts no connection before the model is warm. Workers sharing one
    port (serve.workers > 1) need that: a client or probe cannot choose which worker answers, and a
    worker still warming would take its share of requests only to refuse them with 503.

    Raises ``SchedulerUnavailableError`` (a ValueError naming the family) for an autoregressive model
    without a token-step decoder."""
    context = ServeContext(settings, served)
    state, metrics = context.state, context.metrics
    use_decoder_chunks = settings.streaming == "decoder_chunks" and served.decoder_streaming
    streams_tokens = served.capabilities.streaming_unit == "tokens"  # chunks come from the step decoder
    if settings.streaming == "decoder_chunks" and not served.decoder_streaming and not streams_tokens:
        log.warning("serve.streaming=decoder_chunks needs a family that streams decoder frames on an engine that "
                    "offers them; %s (family %s) runs %s: streaming by sentence",
                    served.model_id, served.family.name, served.engine)

    gc_pauses = GcPauseRecorder(metrics.gc_pause_s)
    if served.noise_device.startswith("cuda"):
        metrics.device_memory.set_function(lambda: device_memory_reserved(served.noise_device))

    def run_batch(jobs: list[SentenceJob]) -> list[np.ndarray]:
        return synthesize_jobs(served.model, jobs, served.noise_channels, served.noise_device)

    step_decoder = _step_decoder_of(served)  # refuses an autoregressive model without one, before it starts

    def warm_up() -> None:
        batches = warmup_batches(served, settings)
        for batch in batches:
            run_batch(batch)
        started_s = time.perf_counter()
        if captured := capture_shapes_between(served, settings):
            log.info("warm-up: %d more shapes captured between those the batches met, in %.1f s", captured,
                     time.perf_counter() - started_s)
        if use_decoder_chunks:
            for _ in decoder_chunks(served.model, batches[0][0], served.noise_channels,
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
        if settings.gc_freeze:
            freeze_warm_heap()
        state.gc_thresholds = space_full_collections(settings.gc_full_collection_after)
        state.ready = True
        log.info("ready: %s (%s, %s) warmed up in %.1f s%s", served.model_id, served.engine, served.note or "named",
                 time.perf_counter() - started_s, device_memory_note(served.noise_device))

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        state.executor = model_threads(settings)
        gc_pauses.install()
        if step_decoder is not None:
            decoder = step_decoder(settings.max_batch_size)
            stream_chunks = (settings.streaming == "decoder_chunks" and streams_tokens
                             and isinstance(decoder, StreamingTokenStepDecoder))
            if settings.streaming == "decoder_chunks" and not stream_chunks:
                log.warning("serve.streaming=decoder_chunks: the step decoder of %s (family %s) hands out no "
                            "chunks (models.interface.StreamingTokenStepDecoder): streaming by sentence",
                            served.model_id, served.family.name)
            state.batcher = TokenStepScheduler(decoder, executor=state.executor, on_step=metrics.batch_size.observe,
                                               stream_chunks=stream_chunks)
        else:
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
            # Lifespan state reaches every connection's protocol: its refusals (header deadline and size) count here.
            yield {REFUSAL_COUNTER_STATE_KEY: lambda reason: metrics.rejected.labels(reason).inc()}
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
            gc_pauses.uninstall()
            if settings.gc_freeze:
                unfreeze_heap()
            if state.gc_thresholds is not None:
                restore_thresholds(state.gc_thresholds)

    app = SpeechServerApp(
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
    app.outer_middleware = lambda inner: ErrorBoundaryMiddleware(ClientLimitsMiddleware(
        inner, route_body_caps={UPLOAD_ROUTE: BodyCap(settings.max_upload_bytes + MULTIPART_FRAMING_BYTES,
                                                      "upload_too_large")},
        default_body_cap=BodyCap(settings.max_body_bytes), body_read_timeout_s=settings.body_read_timeout_s,
        on_refusal=lambda code: metrics.rejected.labels(code).inc()))
    authorized = [Depends(require_api_key)]
    app.include_router(speech_router(context), dependencies=authorized)
    app.include_router(voices_router(context), dependencies=authorized)
    app.include_router(health_router(context))
    app.state.serve = state
    app.state.metrics = metrics
    return app
