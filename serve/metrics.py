"""Prometheus metrics of one server (GET /metrics), in a registry of its own.

A registry per app keeps two servers in one process (the tests) from colliding.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from serve.client_limits import REFUSED_STATUS_SCOPE_KEY
from serve.gc_pauses import GC_PAUSE_BUCKETS_S

LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Up to the batches of a GPU engine serving short sentences (serve.max_batch_size 1,024 and more).
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 2048)
# A request's text through the front end: under 0.1 ms a sentence (English, or Mandarin words cached) to
# about 1.5 ms (GPT-SoVITS's Mandarin read afresh), times the sentences of a request.
FRONTEND_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class ServeMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("tts_http_requests", "HTTP requests by route and status",
                                ["route", "method", "status"], registry=self.registry)
        self.request_latency_s = Histogram("tts_http_request_duration_seconds",
                                           "Time to the response headers, by route", ["route"],
                                           buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.speech_latency_s = Histogram("tts_speech_duration_seconds",
                                          "Time from a speech request to its last audio byte",
                                          buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.time_to_first_audio_s = Histogram("tts_time_to_first_audio_seconds",
                                               "Time from a speech request to its first audio chunk",
                                               buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.audio_seconds = Counter("tts_audio_seconds", "Seconds of audio synthesized", registry=self.registry)
        self.admitted = Gauge("tts_requests_in_flight", "Speech requests admitted and not yet synthesized",
                              registry=self.registry)
        self.queue_depth = Gauge("tts_batcher_queue_depth", "Sentences waiting for a batch", registry=self.registry)
        self.batch_size = Histogram("tts_batch_size", "Sentences per batch run", buckets=BATCH_SIZE_BUCKETS,
                                    registry=self.registry)
        self.rejected = Counter("tts_rejected_requests", "Requests refused, by reason (queue_full, too_many_requests, "
                                "header_timeout, headers_too_large, request_timeout, body_too_large, "
                                "first_audio_timeout, synthesis_failed, ...)", ["reason"],
                                registry=self.registry)
        self.disconnects = Counter("tts_disconnected_responses", "Responses the server cut short, by reason "
                                   "(slow_reader, total_timeout, synthesis_failed)", ["reason"], registry=self.registry)
        self.device_memory = Gauge("tts_device_memory_reserved_bytes",
                                   "GPU memory this process's allocator holds, CUDA graph pools included",
                                   registry=self.registry)
        self.gc_pause_s = Histogram("tts_gc_pause_seconds", "Garbage collections of this process, by generation: "
                                    "the GIL is held throughout (serve/gc_pauses.py)", ["generation"],
                                    buckets=GC_PAUSE_BUCKETS_S, registry=self.registry)
        self.frontend_s = Histogram("tts_frontend_seconds", "Wall time of a speech request's text in the family's "
                                    "front end, waits for the GIL included", buckets=FRONTEND_BUCKETS_S,
                                    registry=self.registry)
        # Pure-Python front ends hold the GIL for their CPU time, which the event loop and the batcher's
        # launches then wait out: this, over wall time, is the host's share a loaded server loses to them.
        self.frontend_cpu_s = Counter("tts_frontend_cpu_seconds", "CPU time of the front end's thread on speech "
                                      "requests' text", registry=self.registry)
        self.speaker_cache = Counter("tts_speaker_cache_lookups", "Speaker-embedding cache lookups", ["result"],
                                     registry=self.registry)


class RequestMetricsMiddleware:
    """Counts HTTP requests by route, method and status, and times each to its response headers.

    Plain ASGI rather than ``@app.middleware("http")``: Starlette's BaseHTTPMiddleware passes every
    body chunk of a streamed response through a memory stream of its own, about 8 % of the
    server's CPU under load (py-spy, stub model, 2026-11-30).
    """

    def __init__(self, app, metrics: ServeMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started_s = time.perf_counter()

        async def send_counted(message):
            if message["type"] == "http.response.start":
                route = scope.get("route")  # set by the router on this same scope before the endpoint runs
                route_path = route.path if route is not None else "unmatched"
                status = scope.get(REFUSED_STATUS_SCOPE_KEY, message["status"])  # what the client got
                self.metrics.requests.labels(route_path, scope["method"], str(status)).inc()
                self.metrics.request_latency_s.labels(route_path).observe(time.perf_counter() - started_s)
            await send(message)

        await self.app(scope, receive, send_counted)
