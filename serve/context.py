"""What every route of the server shares: settings, the served model, live state and metrics.

    context = ServeContext(settings, served)     # built once by serve/app.py's create_app
    router = speech_router(context)              # serve/speech.py, serve/voices.py, serve/health.py
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from models.interface import ReferenceClip
from serve.batching import SentenceScheduler
from serve.engines import ServedModel
from serve.errors import ApiError
from serve.metrics import ServeMetrics
from serve.schemas import ErrorBody, VoiceObject
from serve.settings import ServeSettings
from serve.speaker_cache import SpeakerCache
from serve.uploads import UploadLimits

RETRY_AFTER_S = "1"
ERROR_RESPONSES = {status: {"model": ErrorBody} for status in (400, 401, 404, 408, 413, 415, 429, 500, 503, 504)}


@dataclass
class ServerState:
    ready: bool = False
    warmup_error: str | None = None
    shutting_down: bool = False
    admitted: int = 0  # speech requests waiting or running
    uploaded_voices: dict[str, VoiceObject] = field(default_factory=dict)
    reference_clips: dict[str, ReferenceClip] = field(default_factory=dict)  # by voice id: what zero-shot speech uses
    batcher: SentenceScheduler | None = None
    executor: ThreadPoolExecutor | None = None
    speaker_cache: SpeakerCache | None = None
    gc_thresholds: tuple[int, int, int] | None = None  # the collector's thresholds before the server spaced them


@dataclass
class ServeContext:
    settings: ServeSettings
    served: ServedModel
    metrics: ServeMetrics = field(default_factory=ServeMetrics)
    state: ServerState = field(default_factory=ServerState)

    @property
    def model_ids(self) -> tuple[str, ...]:
        return (self.served.model_id, *self.settings.model_aliases)

    @property
    def builtin_voices(self) -> tuple[str, ...]:
        return (self.served.voice_name, *self.settings.voice_aliases)

    @property
    def upload_limits(self) -> UploadLimits:
        settings = self.settings
        return UploadLimits(settings.max_upload_bytes, settings.max_upload_s, settings.min_upload_s,
                            settings.min_upload_sample_rate_hz, settings.max_upload_sample_rate_hz)

    def refuse(self, reason: str, message: str) -> ApiError:
        """A 503 with Retry-After, counted in the rejected-requests metric under ``reason``."""
        self.metrics.rejected.labels(reason).inc()
        return ApiError(503, message, reason, "server_error", headers={"Retry-After": RETRY_AFTER_S})
