"""Typed settings of the serving runtime (`python -m serve`), from the config group ``conf/serve``.

``serve_settings_from_config`` builds one from the composed config's ``serve`` group, so a bad
or unknown ``serve.*`` key stops `python -m serve` at start, naming the key.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from core.config import ConfigError, build_dataclass
from core.paths import DEFAULT_CACHE_DIR
from models.family import Family
from models.registry import FAMILIES

# What ``source`` may name besides "champion": the variants serve can build without a manifest.
# fp16 and bf16 are the teacher with its parts in half precision, built as compress/half_precision.py
# builds them (models/precision.py), so they run on the torch engines like the teacher; int8_dynamic is
# the teacher with int8_parts' Linear layers in dynamic int8 (models/dynamic_int8.py), eager on the CPU.
SERVABLE_VARIANTS = ("original_onnx", "teacher", "fp16", "bf16", "int8_dynamic")
HALF_PRECISION_VARIANTS = {"fp16": "float16", "bf16": "bfloat16"}
STREAMING_MODES = ("sentence", "decoder_chunks")
GPU_SHARING_MODES = ("time_slices", "mps")  # serve/gpu_sharing.py
TORCH_ENGINES = ("eager", "cuda_graphs", "compile", "aoti")  # a family's bucketed engines (models/<family>/engines.py)


class ServeConfigError(ConfigError):
    """A ``serve.*`` value the server cannot use; raised before the model loads."""


@dataclass(frozen=True)
class ServeSettings:
    family: str = ""  # the served model's family (models/registry.py); a manifest names its own
    host: str = "127.0.0.1"
    port: int = 8000
    # "champion": the manifest at manifest_path (falls back to fallback_variant when there is none);
    # or a variant name from SERVABLE_VARIANTS.
    source: str = "champion"
    manifest_path: str = ""
    fallback_variant: str = "original_onnx"
    voice: str = ""  # for variant sources, "" for the family's default voice; a manifest names its own
    cache_dir: str = str(DEFAULT_CACHE_DIR)  # where converted teacher weights are cached
    device: str = "cpu"  # the torch engine's device
    threads: int = 1  # onnxruntime intra-op threads
    torch_threads: int = 1  # torch's intra-op threads in each model thread, on a CPU device
    torch_engine: str = "eager"  # the teacher's engine: eager | cuda_graphs (CUDA only) | compile | aoti
    half_keep_fp32: tuple[str, ...] = ("encoder", "duration")  # fp16/bf16 sources: parts left in float32
    int8_parts: tuple[str, ...] = ()  # int8_dynamic source: parts whose Linear layers run in dynamic int8
    int8_keep_float: tuple[str, ...] = ()  # int8_dynamic source: Linear modules (fnmatch patterns) left float32
    aoti_package_dir: str = ""  # where the aoti engine writes its packages
    cudnn_benchmark: bool = False  # bucketed engines on CUDA: cuDNN times its convolutions per new shape
    # The family's own bucketed-engine settings (its Family.engine_options dataclass); checked at start
    engine_options: dict = dataclasses.field(default_factory=dict)
    # Dynamic batching
    max_batch_size: int = 8
    max_wait_ms: float = 10.0
    batches_in_flight: int = 1  # 2: a GPU engine prepares the next batch while the device runs this one
    length_buckets: tuple[int, ...] = (64, 128, 256, 512)  # upper bounds in phoneme ids
    max_batch_phonemes: int = 8192  # rows x longest ids x length_scale per batch, padded (batching.BatchBudget)
    queue_capacity: int = 64  # speech requests admitted at once (waiting for or in synthesis)
    # Clients: what one client may hold, and for how long (serve/client_limits.py, serve/speech.py)
    max_requests_per_client: int = 16  # speech requests admitted at once per API key, or per address without auth
    first_audio_timeout_s: float = 30.0  # no audio by then: 504 first_audio_timeout
    total_timeout_s: float = 120.0  # all audio made by then, else the stream is cut
    slow_client_grace_s: float = 10.0  # how far behind real time a client may read before it is disconnected
    header_read_timeout_s: float = 10.0  # a request's head (line and headers) by then, else 408 (serve/http_protocol.py)
    body_read_timeout_s: float = 30.0  # the whole request body by then, else 408
    max_body_bytes: int = 1_000_000  # request bodies but uploads (max_upload_bytes + multipart framing)
    keep_alive_timeout_s: float = 5.0  # uvicorn's timeout_keep_alive: idle time between requests on one connection
    max_connections: int = 1024  # uvicorn's limit_concurrency: open connections (and tasks) past which it answers 503
    max_header_bytes: int = 16_384  # a request's head at most this, else 431 (serve/http_protocol.py)
    # Streaming
    streaming: str = "sentence"
    decoder_chunk_frames: int = 32
    decoder_context_frames: int = 16
    # Text
    max_input_chars: int = 4096
    max_sentence_chars: int = 300
    default_seed: int | None = 0
    # Reference uploads (POST /v1/voices)
    max_upload_bytes: int = 10_000_000
    max_upload_s: float = 30.0
    min_upload_s: float = 1.0
    min_upload_sample_rate_hz: int = 16_000
    max_upload_sample_rate_hz: int = 48_000
    # Speaker-embedding cache
    speaker_cache_entries: int = 1024
    speaker_cache_ttl_s: float = 86_400.0
    redis_url: str | None = None
    # Access and lifecycle
    api_key: str | None = None
    warmup: bool = True
    # Bucketed engines on a GPU warm each text bucket at these paces too, so the frame buckets either side
    # of the voice's own are captured before load; a deployment whose clients never set speed needs [1.0]
    warmup_length_scales: tuple[float, ...] = (0.8, 1.0, 1.25)
    # After the warm-up, move the warm heap (compiled graphs, front-end dictionaries) out of the garbage
    # collector's scans, whose full passes hold the GIL and starve the GPU of launches (serve/gc_pauses.py)
    gc_freeze: bool = True
    # Once warm, a full collection waits for this many collections of generation 1 (CPython's third
    # threshold, 10 by default): served requests leave no cycles, so under load its frequent passes found nothing
    gc_full_collection_after: int = 100
    access_log: bool = True
    workers: int = 1  # server processes sharing the port, each with its own model and batcher
    # How those workers share one GPU: time_slices (CUDA's default) or mps (a CUDA MPS daemon of the server's
    # own, under which their kernels run at once; serve/gpu_sharing.py)
    gpu_sharing: str = "time_slices"
    shutdown_grace_s: float = 30.0
    model_aliases: tuple[str, ...] = ()
    voice_aliases: tuple[str, ...] = ()

    def to_json(self) -> str:
        """The settings as JSON, for worker processes (``from_json`` reads them back)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeSettings:
        fields = json.loads(text)
        return cls(**{key: tuple(value) if isinstance(value, list) else value for key, value in fields.items()})

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """Batch sizes a bucketed engine pads to: powers of two below max_batch_size, and it."""
        return tuple(sorted({min(2**k, self.max_batch_size) for k in range(self.max_batch_size.bit_length() + 1)}))

    def __post_init__(self):
        def fail(key: str, accepted: str):
            raise ServeConfigError(f"serve.{key}={getattr(self, key)!r}: {accepted}")

        for spec in dataclasses.fields(self):  # before the range checks, which would fail on a string unnamed
            value = getattr(self, spec.name)
            if spec.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
                fail(spec.name, "use a whole number")
            if spec.type == "float" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                fail(spec.name, "use a number")

        if self.source != "champion" and self.source not in SERVABLE_VARIANTS:
            fail("source", f"use 'champion' or one of {list(SERVABLE_VARIANTS)}")
        if self.fallback_variant not in SERVABLE_VARIANTS:
            fail("fallback_variant", f"use one of {list(SERVABLE_VARIANTS)}")
        if self.source == "champion" and not self.manifest_path:
            fail("manifest_path", "give the champion's manifest.json path when source is 'champion'")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            fail("device", "use 'cpu' or 'cuda[:N]'")
        if "int8_dynamic" in (self.source, self.fallback_variant if self.source == "champion" else None):
            if not self.int8_parts:
                fail("int8_parts", "int8_dynamic needs the parts whose Linear layers run in int8; the family's "
                                   "stage defaults (stages.int8_dynamic.parts) name none")
            if self.device != "cpu" or self.torch_engine != "eager":
                fail("source", "int8_dynamic runs eager on torch's CPU kernels: set serve.device=cpu and "
                               "serve.torch_engine=eager")
        serves_original = self.source == "original_onnx" or (self.source == "champion"
                                                              and self.fallback_variant == "original_onnx")
        if self.voice.endswith(".safetensors") and serves_original:
            fail("voice", "a converted .safetensors voice has no ONNX graph for original_onnx: give a .onnx voice "
                          "or serve the teacher (and set fallback_variant=teacher)")
        if self.torch_engine not in TORCH_ENGINES:
            fail("torch_engine", f"use one of {list(TORCH_ENGINES)}")
        if self.torch_engine == "cuda_graphs" and not self.device.startswith("cuda"):
            fail("torch_engine", "cuda_graphs needs serve.device=cuda")
        if self.torch_engine == "aoti" and not self.aoti_package_dir:
            fail("aoti_package_dir", "give the folder the aoti engine writes its packages to")
        if not 0 <= self.port <= 65535:
            fail("port", "use 0..65535 (0 picks a free port)")
        if self.workers > 1 and self.port == 0:
            fail("port", "several workers share one port: give a fixed port, not 0")
        if self.gpu_sharing not in GPU_SHARING_MODES:
            fail("gpu_sharing", f"use one of {list(GPU_SHARING_MODES)}")
        if self.gpu_sharing == "mps" and (self.workers < 2 or not self.device.startswith("cuda")):
            fail("gpu_sharing", "mps shares one GPU between worker processes: set serve.device=cuda and "
                                "serve.workers >= 2")
        for key in ("workers", "threads", "torch_threads", "max_batch_size", "max_batch_phonemes",
                    "batches_in_flight", "queue_capacity", "decoder_chunk_frames", "max_input_chars",
                    "max_sentence_chars", "max_upload_bytes", "speaker_cache_entries", "min_upload_sample_rate_hz",
                    "max_requests_per_client", "max_body_bytes", "max_connections", "max_header_bytes",
                    "gc_full_collection_after"):
            if getattr(self, key) < 1:
                fail(key, "must be >= 1")
        for key in ("max_wait_ms", "decoder_context_frames"):
            if getattr(self, key) < 0:
                fail(key, "must be >= 0")
        for key in ("first_audio_timeout_s", "total_timeout_s", "slow_client_grace_s", "body_read_timeout_s",
                    "header_read_timeout_s",
                    "keep_alive_timeout_s", "max_upload_s", "min_upload_s", "speaker_cache_ttl_s", "shutdown_grace_s"):
            if getattr(self, key) <= 0:
                fail(key, "must be > 0")
        if self.first_audio_timeout_s > self.total_timeout_s:
            fail("first_audio_timeout_s", f"must be <= total_timeout_s ({self.total_timeout_s:g}): the first audio "
                                          "is part of the whole")
        if not self.length_buckets or list(self.length_buckets) != sorted(set(self.length_buckets)) \
                or self.length_buckets[0] < 1:
            fail("length_buckets", "give strictly increasing positive phoneme-id lengths, e.g. [64, 128, 256]")
        if self.streaming not in STREAMING_MODES:
            fail("streaming", f"use one of {list(STREAMING_MODES)}")
        if self.min_upload_s > self.max_upload_s:
            fail("min_upload_s", f"must be <= max_upload_s ({self.max_upload_s})")
        if self.min_upload_sample_rate_hz > self.max_upload_sample_rate_hz:
            fail("min_upload_sample_rate_hz", f"must be <= max_upload_sample_rate_hz ({self.max_upload_sample_rate_hz})")
        if not self.warmup_length_scales or any(isinstance(scale, bool) or not isinstance(scale, (int, float))
                                                or scale <= 0 for scale in self.warmup_length_scales):
            fail("warmup_length_scales", "give one or more paces > 0, e.g. [0.8, 1.0, 1.25]")
        if self.family not in FAMILIES:
            fail("family", f"use a registered family: {sorted(FAMILIES)}")
        if self.api_key is not None and len(self.api_key) < 8:  # the value is a secret: not echoed
            raise ServeConfigError("serve.api_key: use null (no auth) or a token of at least 8 characters")
        self.family_engine_options()  # a bad key or value stops the server here, not when the engine is built

    def family_engine_options(self, family: Family | None = None):
        """``engine_options`` as the settings dataclass of ``family`` (default: the registered ``self.family``);
        None for a family without one when none are given. Unknown keys and refused values raise
        ServeConfigError."""
        family = family or FAMILIES[self.family]
        options_type = family.engine_options
        if not isinstance(self.engine_options, dict):
            accepted = [] if options_type is None else [spec.name for spec in dataclasses.fields(options_type)]
            raise ServeConfigError(f"serve.engine_options={self.engine_options!r}: use a mapping of the family's "
                                   f"engine settings ({family.name}'s: {accepted})")
        if options_type is None:
            if self.engine_options:
                raise ServeConfigError(f"serve.engine_options={self.engine_options!r}: family {family.name} has "
                                       "no engine settings; leave it empty")
            return None
        try:
            return build_dataclass(options_type, self.engine_options, "serve.engine_options")
        except (ConfigError, ValueError, TypeError) as error:
            raise ServeConfigError(str(error)) from error


def serve_settings_from_config(resolved: dict) -> ServeSettings:
    """``resolved``: the composed config as a plain dict; only its ``serve`` group is read."""
    if "serve" not in resolved:
        raise ServeConfigError("the config has no 'serve' group: compose conf/config.yaml")
    return build_dataclass(ServeSettings, resolved["serve"], "serve")
