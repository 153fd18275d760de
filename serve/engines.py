"""The model `python -m serve` runs: the champion's manifest, or a named variant.

    served = load_served_model(settings)   # settings: serve.settings.ServeSettings
    served.model.synthesize(request)       # any TTSModel

``source: champion`` loads ``manifest_path`` (export/manifest.py) into onnxruntime; when no
manifest exists it serves ``fallback_variant`` instead and says so in ``ServedModel.note``.
A manifest that exists but is broken stops the server: serving a different model silently
would be worse.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from export.manifest import load_manifest
from models.interface import TTSModel
from serve.settings import HALF_PRECISION_VARIANTS, SERVABLE_VARIANTS, ServeSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    model: TTSModel
    model_id: str  # the variant name clients pass as `model`
    family: str  # decides which request fields apply ("piper": no emotion, prompt or zero-shot voice)
    engine: str  # "onnxruntime", "torch" (eager), "torch_cuda_graphs", "torch_compile" or "torch_aoti"
    voice: str
    latent_channels: int  # width of the prior noise each request draws (serve/batching.py)
    note: str = ""  # how the model was chosen, for logs and GET /v1/models-style listings
    noise_device: str = "cpu"  # where request noise is drawn: the device of a bucketed GPU engine
    captures_graphs: bool = False  # a bucketed engine replaying CUDA graphs: each new shape is captured once

    @property
    def decoder_streaming(self) -> bool:
        """Whether the decoder can run on windows of latent frames (torch VITS engine only)."""
        return self.engine == "torch"

    @property
    def voice_name(self) -> str:
        """The voice's own speaker name, e.g. ``joe`` for ``bundled:joe`` or ``en_US-joe-medium.onnx``."""
        if self.voice.startswith("bundled:"):
            return self.voice.split(":", 1)[1]
        stem = Path(self.voice).name.removesuffix(".onnx")
        parts = stem.split("-")
        return parts[1] if len(parts) == 3 else stem  # Piper names voices <lang>-<name>-<quality>


def device_memory_reserved(device: str) -> int:
    """Bytes the CUDA caching allocator holds on ``device`` (graph pools included); 0 off CUDA."""
    if not device.startswith("cuda"):
        return 0
    import torch

    return torch.cuda.memory_reserved(device)


def device_memory_note(device: str) -> str:
    """", 3.2 GiB reserved on cuda (peak 5.1 GiB)" for the ready log line; "" off CUDA."""
    if not device.startswith("cuda"):
        return ""
    import torch

    return (f", {device_memory_reserved(device) / 2**30:.1f} GiB reserved on {device} "
            f"(peak {torch.cuda.max_memory_reserved(device) / 2**30:.1f} GiB)")


def _bucketed(voice, settings: ServeSettings):
    """The voice behind models.piper.engines' bucketed engine: eager stages replayed as CUDA graphs
    (cuda_graphs), torch.compile'd stages (compile; replayed as CUDA graphs on a GPU too), or
    AOTInductor packages (aoti)."""
    import torch

    from models.piper.engines import BucketedEngine, EngineVoice, StageBackend

    kind = {"cuda_graphs": "eager"}.get(settings.torch_engine, settings.torch_engine)
    if settings.device.startswith("cuda"):
        # Process-wide, and right here only: the eager engine would re-time its convolutions for every
        # new utterance length. Off by default: frame buckets first met under load stall while timed.
        torch.backends.cudnn.benchmark = settings.cudnn_benchmark
    # AOTInductor's runner cannot be captured in a CUDA graph (torch 2.11): it runs as compiled.
    graphs = settings.device.startswith("cuda") and kind != "aoti"
    engine = BucketedEngine(voice.model, voice.sample_rate_hz, graphs=graphs,
                            backend=StageBackend(kind, package_dir=settings.aoti_package_dir or None),
                            batch_buckets=settings.batch_buckets)
    return EngineVoice(voice, engine)


def load_variant(variant: str, voice: str, threads: int, device: str,
                 settings: ServeSettings | None = None) -> ServedModel:
    """``original_onnx`` (the voice's own graph in onnxruntime), ``teacher`` (the PyTorch port; eager,
    or on the bucketed engine ``settings.torch_engine`` names), or ``fp16``/``bf16`` (the teacher with
    every part but ``settings.half_keep_fp32`` in half precision, on the same engines)."""
    if variant == "original_onnx":
        from models.piper.onnx_runtime import PiperOnnxRuntimeVoice

        model = PiperOnnxRuntimeVoice(voice, threads=threads)
        return ServedModel(model, variant, "piper", "onnxruntime", voice, model.latent_channels)
    if variant == "teacher" or variant in HALF_PRECISION_VARIANTS:
        from models.piper.voice import PiperVoice

        model = PiperVoice.load(voice).to(device)
        if variant in HALF_PRECISION_VARIANTS:
            from models.precision import to_half_precision

            keep_fp32 = settings.half_keep_fp32 if settings is not None else ServeSettings.half_keep_fp32
            model = to_half_precision(model, HALF_PRECISION_VARIANTS[variant], keep_fp32=keep_fp32)
        latent_channels = model.model.hp.latent_channels
        if settings is None or settings.torch_engine == "eager":
            return ServedModel(model, variant, "piper", "torch", voice, latent_channels)
        engine_voice = _bucketed(model, settings)
        return ServedModel(engine_voice, variant, "piper", f"torch_{settings.torch_engine}", voice,
                           latent_channels, noise_device=device, captures_graphs=engine_voice.engine.graphs)
    raise ValueError(f"variant {variant!r} cannot be served without a manifest: use one of {list(SERVABLE_VARIANTS)}")


def load_served_model(settings: ServeSettings) -> ServedModel:
    if settings.source != "champion":
        return load_variant(settings.source, settings.voice, settings.threads, settings.device, settings)
    manifest_path = Path(settings.manifest_path)
    if not manifest_path.exists():
        note = f"no champion manifest at {manifest_path}: serving {settings.fallback_variant}"
        log.warning(note)
        served = load_variant(settings.fallback_variant, settings.voice, settings.threads, settings.device)
        return dataclasses.replace(served, note=note)
    from models.piper.onnx_runtime import PiperOnnxRuntimeVoice

    manifest = load_manifest(manifest_path)  # ManifestError names the field at fault
    model = PiperOnnxRuntimeVoice(manifest.voice, settings.threads, graph_path=manifest.graph_path(manifest_path))
    if model.sample_rate_hz != manifest.sample_rate_hz:
        raise ValueError(f"{manifest_path}: sample_rate_hz {manifest.sample_rate_hz} but voice "
                         f"{manifest.voice!r} speaks at {model.sample_rate_hz} Hz")
    return ServedModel(model, manifest.variant, manifest.family, manifest.engine, manifest.voice,
                       model.latent_channels, note=f"champion from {manifest_path}")
