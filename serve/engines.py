"""The model `python -m serve` runs: the champion's manifest, or a named variant of the configured family.

    served = load_served_model(settings)   # settings: serve.settings.ServeSettings
    served.model.synthesize(request)       # any TTSModel
    served.capabilities                    # what the API may pass it (models/interface.py)

Every model comes through the family registry (models/registry.py): the teacher from
``family.load_teacher``, the family's own graph and exported graphs from ``family.reference``.
``source: champion`` loads ``manifest_path`` (export/manifest.py), which names its family and either
a graph or the recipe that rebuilds the variant from the teacher (fp16, int8_dynamic ...); when no
manifest exists it serves ``fallback_variant`` instead and says so in ``ServedModel.note``. A
manifest that exists but is broken stops the server: serving a different model silently would be
worse.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from export.manifest import REBUILD_ENGINE, load_manifest
from models.dynamic_int8 import to_dynamic_int8
from models.family import Family
from models.interface import Capabilities, TTSModel
from models.registry import get_family
from models.voice_spec import spec_name
from serve.settings import HALF_PRECISION_VARIANTS, SERVABLE_VARIANTS, ServeSettings

# A rebuilt manifest's recipe field -> the serve setting it stands for (export.manifest.REBUILT_VARIANTS)
RECIPE_SETTINGS = {"keep_fp32": "half_keep_fp32", "parts": "int8_parts", "keep_float": "int8_keep_float"}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    model: TTSModel
    model_id: str  # the variant name clients pass as `model`
    family: Family  # its capabilities decide which request fields apply
    engine: str  # "onnxruntime", "torch" (eager), "torch_cuda_graphs", "torch_compile" or "torch_aoti"
    voice: str
    # Channels of the per-sentence noise a sampling type with explicit noise draws (serve/batching.py);
    # None for models that draw no noise tensors.
    noise_channels: int | None = None
    note: str = ""  # how the model was chosen, for logs and GET /v1/models-style listings
    noise_device: str = "cpu"  # where request noise is drawn: the device of a bucketed GPU engine
    captures_graphs: bool = False  # a bucketed engine replaying CUDA graphs: each new shape is captured once
    text_buckets: tuple[int, ...] = ()  # phoneme-id lengths a bucketed engine pads to; () runs exact shapes
    # A bucketed engine that runs a batch in length groups (the model's ``length_groups`` > 1): each group
    # meets its own frame bucket, so a warm-up of equal-length rows would leave most of its shapes unmet.
    splits_by_length: bool = False

    @property
    def capabilities(self) -> Capabilities:
        return self.family.capabilities

    @property
    def decoder_streaming(self) -> bool:
        """Whether audio can leave in windows of decoder frames: the family streams by decoder frames and
        this engine hands out the decoder's input (``decoder_latent``; the eager torch engine)."""
        return (self.capabilities.streaming_unit == "decoder_frames"
                and callable(getattr(self.model, "decoder_latent", None)))

    @property
    def voice_name(self) -> str:
        """The voice's own speaker name, e.g. ``joe`` for ``bundled:joe`` or ``en_US-joe-medium.onnx``;
        ``random`` or the first file's name for a family whose voice is a set of files (models/voice_spec.py)."""
        if self.voice.startswith("bundled:"):
            return self.voice.split(":", 1)[1]
        if self.family.voice_fields:  # "random" or KEY=PATH;... (models/voice_spec.py)
            return spec_name(self.voice)
        stem = Path(self.voice).name.removesuffix(".onnx")
        parts = stem.split("-")
        return parts[1] if len(parts) == 3 else stem  # voice files named <lang>-<name>-<quality>


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


def _noise_channels(model) -> int | None:
    """The latent width a model with explicit-noise sampling scales its prior noise by (``latent_channels``);
    None for a model that draws no noise tensors."""
    return getattr(model, "latent_channels", None)


def served_as_is(model: TTSModel, family: Family, variant: str, voice: str, engine: str = "torch") -> ServedModel:
    """A model already loaded, served on the engine it runs on (no bucketing, no warm-up shapes)."""
    return ServedModel(model, variant, family, engine, voice, _noise_channels(model))


def _bucketed(family: Family, teacher: TTSModel, settings: ServeSettings,
              precision: str | None = None) -> tuple[TTSModel, bool, tuple[int, ...]]:
    """(the teacher on the family's bucketed engine, whether it replays CUDA graphs, its text buckets): eager
    stages replayed as CUDA graphs (cuda_graphs), torch.compile'd stages (compile; replayed as CUDA graphs on
    a GPU too), or AOTInductor packages (aoti). ``precision`` (float16/bfloat16): the engine builds the half
    variant itself (``family.engine_precision``)."""
    import torch

    if family.torch_engine is None:
        raise ValueError(f"family {family.name} has no bucketed torch engines: use serve.torch_engine=eager")
    kind = {"cuda_graphs": "eager"}.get(settings.torch_engine, settings.torch_engine)
    if settings.device.startswith("cuda"):
        # Process-wide, and right here only: the eager engine would re-time its convolutions for every
        # new utterance length. Off by default: frame buckets first met under load stall while timed.
        torch.backends.cudnn.benchmark = settings.cudnn_benchmark
    # AOTInductor's runner cannot be captured in a CUDA graph (torch 2.11): it runs as compiled.
    graphs = settings.device.startswith("cuda") and kind != "aoti"
    engine_options = {} if precision is None else {"precision": getattr(torch, precision)}
    family_options = settings.family_engine_options(family)
    if family_options is not None:
        engine_options["options"] = family_options
    return family.torch_engine(teacher, kind, graphs, settings.aoti_package_dir or None, settings.batch_buckets,
                               **engine_options)


def load_variant(family: Family, variant: str, voice: str, threads: int, device: str,
                 settings: ServeSettings | None = None) -> ServedModel:
    """``original_onnx`` (the family's own graph in onnxruntime), ``teacher`` (the PyTorch model; eager, or on
    the bucketed engine ``settings.torch_engine`` names), or ``fp16``/``bf16`` (the teacher with every part but
    ``settings.half_keep_fp32`` in half precision, on the same engines; on a bucketed engine of a family with
    ``engine_precision`` the engine makes the half variant its own way instead, and ``half_keep_fp32`` is not
    read), or ``int8_dynamic`` (the teacher with ``settings.int8_parts``' Linear layers in dynamic int8, eager
    on the CPU). ``voice``: "" for the family's own."""
    voice = voice or family.default_voice
    if variant == "original_onnx":
        if family.reference is None:
            raise ValueError(f"family {family.name} ships no graph of its own: serve teacher, fp16 or bf16")
        model = family.reference.load(voice, threads)
        return served_as_is(model, family, variant, voice, "onnxruntime")
    if variant == "int8_dynamic":
        return _dynamic_int8(family, voice, device, settings)
    if variant == "teacher" or variant in HALF_PRECISION_VARIANTS:
        # Without settings: ServeSettings' defaults, read off the class (an instance would need a source).
        defaults = settings or ServeSettings
        model = family.load_teacher(voice, Path(defaults.cache_dir)).to(device)
        precision = HALF_PRECISION_VARIANTS.get(variant)  # None: the float32 teacher
        on_engine = settings is not None and settings.torch_engine != "eager"
        engine_applies_precision = on_engine and family.engine_precision
        if precision is not None and not engine_applies_precision:
            from models.precision import to_half_precision

            model = to_half_precision(model, precision, keep_fp32=defaults.half_keep_fp32)
        if not on_engine:
            return served_as_is(model, family, variant, voice)
        engine_model, captures_graphs, text_buckets = _bucketed(family, model, settings,
                                                                precision if engine_applies_precision else None)
        return ServedModel(engine_model, variant, family, f"torch_{settings.torch_engine}", voice,
                           _noise_channels(model), noise_device=device, captures_graphs=captures_graphs,
                           text_buckets=text_buckets, splits_by_length=getattr(engine_model, "length_groups", 1) > 1)
    raise ValueError(f"variant {variant!r} cannot be served without a manifest: use one of {list(SERVABLE_VARIANTS)}")


def _dynamic_int8(family: Family, voice: str, device: str, settings: ServeSettings | None) -> ServedModel:
    """The teacher with ``settings.int8_parts``' Linear layers in dynamic int8 (models/dynamic_int8.py, the
    conversion the int8_dynamic stage scored), eager on the CPU."""
    if settings is None or not settings.int8_parts:
        raise ValueError("int8_dynamic needs serve.int8_parts: the parts whose Linear layers run in int8 "
                         "(the family's stages.int8_dynamic.parts)")
    if device != "cpu" or settings.torch_engine != "eager":
        raise ValueError(f"int8_dynamic runs eager on torch's CPU kernels; serve.device is {device!r} and "
                         f"serve.torch_engine {settings.torch_engine!r}")
    model = family.load_teacher(voice, Path(settings.cache_dir))
    to_dynamic_int8(model, settings.int8_parts, settings.int8_keep_float)
    return served_as_is(model, family, "int8_dynamic", voice)


def load_served_model(settings: ServeSettings) -> ServedModel:
    family = get_family(settings.family)
    if settings.source != "champion":
        return load_variant(family, settings.source, settings.voice, settings.threads, settings.device, settings)
    manifest_path = Path(settings.manifest_path)
    if not manifest_path.exists():
        # A family that ships no graph of its own (no reference runtime) falls back to its teacher.
        fallback = ("teacher" if settings.fallback_variant == "original_onnx" and family.reference is None
                    else settings.fallback_variant)
        note = f"no champion manifest at {manifest_path}: serving {fallback}"
        log.warning(note)
        served = load_variant(family, fallback, settings.voice, settings.threads, settings.device, settings)
        return dataclasses.replace(served, note=note)
    return load_deployed(manifest_path, settings.threads, settings)


def load_deployed(manifest_path: Path, threads: int, settings: ServeSettings | None = None,
                  device: str = "cpu") -> ServedModel:
    """The variant a manifest deploys (the champion): its graph in the family's graph runtime, or the
    variant rebuilt from the teacher by the manifest's recipe (on ``settings``' device and torch engine;
    without settings, eager on ``device``)."""
    manifest = load_manifest(manifest_path)  # ManifestError names the field at fault
    family = get_family(manifest.family)
    if manifest.engine == REBUILD_ENGINE:
        base = settings or ServeSettings(family=family.name, source="teacher", device=device)  # eager
        rebuilt_settings = dataclasses.replace(base, **{RECIPE_SETTINGS[name]: tuple(value)
                                                        for name, value in manifest.recipe.items()})
        if manifest.variant in HALF_PRECISION_VARIANTS and rebuilt_settings.device == "cpu":
            log.warning("%s: the champion %s is a GPU precision; on the CPU its half-precision kernels run slower "
                        "than float32 (serve.device=cuda serves it as scored)", manifest_path, manifest.variant)
        served = load_variant(family, manifest.variant, manifest.voice, threads, rebuilt_settings.device,
                              rebuilt_settings)
        if served.model.sample_rate_hz != manifest.sample_rate_hz:
            raise ValueError(f"{manifest_path}: sample_rate_hz {manifest.sample_rate_hz} but voice "
                             f"{manifest.voice!r} speaks at {served.model.sample_rate_hz} Hz")
        return dataclasses.replace(served, note=f"champion from {manifest_path}, rebuilt from the teacher "
                                                f"({manifest.recipe or 'as it is'})")
    if family.reference is None:
        raise ValueError(f"{manifest_path}: family {family.name} has no runtime for exported graphs")
    model = family.reference.load_graph(manifest.voice, threads, manifest.graph_path(manifest_path))
    if model.sample_rate_hz != manifest.sample_rate_hz:
        raise ValueError(f"{manifest_path}: sample_rate_hz {manifest.sample_rate_hz} but voice "
                         f"{manifest.voice!r} speaks at {model.sample_rate_hz} Hz")
    return ServedModel(model, manifest.variant, family, manifest.engine, manifest.voice, _noise_channels(model),
                       note=f"champion from {manifest_path}")
