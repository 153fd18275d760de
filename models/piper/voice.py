"""A Piper voice in PyTorch behind the common TTSModel interface, with a safetensors cache.

    voice = PiperVoice.load("bundled:joe")                 # or a path to any Piper .onnx voice
    result = voice.synthesize(SynthesisRequest.from_utterances(voice.text_to_utterances("Hi.")))

The first load converts the ONNX graph (a few seconds); later loads read the cached
safetensors file, keyed by the voice file's content hash.

A converted voice travels without its ONNX graph (half the bytes in float16, for a GPU machine
that gets files by the megabyte): ``<name>.safetensors`` with ``<name>.onnx.json`` beside it.

    python -m models.piper.voice --voice bundled:joe --dtype float16 --out .device/voice16/en_US-joe-medium.safetensors
    PiperVoice.load(".device/voice16/en_US-joe-medium.safetensors")
"""
from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import onnx
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from core.file_digest import file_sha256
from models.interface import SynthesisRequest, SynthesisResult, Utterance
from models.sampling import VitsSampling
from models.piper.capabilities import CAPABILITIES, FAMILY_NAME
from models.piper.importer import onnx_to_state_dict
from models.piper.vits import DecoderLatent, PiperVits, VitsHyperParams
from models.piper.voice_files import PiperVoiceFiles
from models.text.espeak_frontend import EspeakFrontend
from core.atomic_io import atomic_write
from core.paths import DEFAULT_CACHE_DIR



def _hyperparams_from_json(text: str) -> VitsHyperParams:
    fields = json.loads(text)
    fields["resblock_dilations"] = tuple(tuple(d) for d in fields["resblock_dilations"])
    for key in ("upsample_rates", "upsample_kernel_sizes", "resblock_kernel_sizes"):
        fields[key] = tuple(fields[key])
    return VitsHyperParams(**fields)


def load_converted_weights(files: PiperVoiceFiles, cache_dir: Path = DEFAULT_CACHE_DIR):
    """(hyperparams, state dict) for a voice, converting and caching on first use."""
    cache_path = Path(cache_dir) / f"{files.onnx_path.stem}-{file_sha256(files.onnx_path)[:16]}.safetensors"
    if cache_path.is_file():
        state = load_file(cache_path)
        return _hyperparams_from_json(_metadata(cache_path)["hyperparams"]), state
    hp, state = onnx_to_state_dict(onnx.load(str(files.onnx_path)))
    metadata = {"hyperparams": json.dumps(asdict(hp)), "source": str(files.onnx_path)}
    atomic_write(cache_path, lambda tmp: save_file(state, tmp, metadata=metadata))  # never a half-written cache
    return hp, state


def _metadata(weights_path: Path) -> dict[str, str]:
    """The string metadata of a safetensors file (the converted voices keep their hyperparameters there)."""
    with safe_open(str(weights_path), framework="pt") as handle:
        return handle.metadata() or {}


def _config_beside(weights_path: Path) -> Path:
    return weights_path.with_name(weights_path.name.removesuffix(".safetensors") + ".onnx.json")


def load_converted_voice(weights_path: Path) -> tuple[VitsHyperParams, dict[str, torch.Tensor], dict]:
    """(hyperparams, float32 state dict, Piper config) of a voice written by ``save_converted_voice``."""
    config_path = _config_beside(weights_path)
    for path in (weights_path, config_path):
        if not path.is_file():
            raise FileNotFoundError(f"converted voice file {path} not found: a .safetensors voice needs "
                                    f"{config_path.name} beside it (python -m models.piper.voice writes both)")
    metadata = _metadata(weights_path)
    if "hyperparams" not in metadata:
        raise ValueError(f"{weights_path} has no 'hyperparams' metadata: not a converted Piper voice")
    state = {name: tensor.float() for name, tensor in load_file(weights_path).items()}
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    return _hyperparams_from_json(metadata["hyperparams"]), state, config


def save_converted_voice(voice: str | Path, out_path: Path, dtype: torch.dtype = torch.float16,
                         cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """Write ``voice``'s PyTorch weights in ``dtype`` (with their hyperparameters) and its Piper
    config beside them, atomically; returns the weights' path."""
    files = PiperVoiceFiles.resolve(voice)
    hp, state = load_converted_weights(files, cache_dir)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(files.config_path, _config_beside(out_path))
    weights = {name: tensor.to(dtype).contiguous() for name, tensor in state.items()}
    metadata = {"hyperparams": json.dumps(asdict(hp)), "source": str(files.onnx_path), "dtype": str(dtype)}
    atomic_write(out_path, lambda tmp: save_file(weights, tmp, metadata=metadata))
    return out_path


class PiperVoice(nn.Module):
    """Piper VITS voice: frontend + PyTorch synthesizer."""

    family = FAMILY_NAME
    capabilities = CAPABILITIES
    sampling_type = VitsSampling

    def __init__(self, model: PiperVits, frontend: EspeakFrontend, sample_rate_hz: int):
        super().__init__()
        self.model = model
        self.frontend = frontend
        self.sample_rate_hz = sample_rate_hz

    @classmethod
    def load(cls, voice: str | Path = "bundled:joe", cache_dir: Path = DEFAULT_CACHE_DIR) -> "PiperVoice":
        """``bundled:joe``, a Piper ``.onnx`` voice, or a converted ``.safetensors`` voice (module docstring)."""
        if str(voice).endswith(".safetensors"):
            hp, state, config = load_converted_voice(Path(voice))
        else:
            files = PiperVoiceFiles.resolve(voice)
            config = files.config()
            hp, state = load_converted_weights(files, cache_dir)
        model = PiperVits(hp)
        model.load_state_dict(state, strict=True)
        model.eval()
        frontend = EspeakFrontend(config["espeak"]["voice"], config["phoneme_id_map"])
        return cls(model, frontend, int(config["audio"]["sample_rate"]))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def hop_length(self) -> int:
        return self.model.hp.hop_length

    @property
    def latent_channels(self) -> int:
        """Channels of the prior noise ``VitsSampling.draw`` makes for this voice."""
        return self.model.hp.latent_channels

    def text_to_utterances(self, text: str) -> list[Utterance]:
        return self.frontend(text)

    def parts(self) -> dict[str, nn.Module]:
        return self.model.parts()

    def replace_part(self, role: str, module: nn.Module) -> None:
        """Swap one part (a pruned decoder, a Lite vocoder, a quantized encoder) in place.

        The replacement must keep the part's call signature; see models/piper/vits.py.
        """
        self.model.replace_part(role, module)

    def _model_inputs(self, request: SynthesisRequest) -> tuple[tuple, dict]:
        """Positional and keyword arguments of PiperVits.forward / infer_latent for a request."""
        self.capabilities.check(request.voice, self.family)
        speaker_id = request.voice.speaker_id if request.voice is not None else None
        hp = self.model.hp
        if hp.num_speakers > 1 and speaker_id is None:
            raise ValueError(f"this voice has {hp.num_speakers} speakers: set speaker_id")
        noise = VitsSampling.of(request.sampling)
        batch, text_length = request.phoneme_ids.shape
        duration_noise, prior_noise = noise.draw(batch, text_length, hp.latent_channels)
        device = self.device
        # Noise enters in float32 whatever the parts compute in: a half-precision part casts at
        # its own edge (models/precision.py), so the steps between parts stay float32.
        args = (request.phoneme_ids.to(device), request.phoneme_lengths.to(device),
                duration_noise.to(device, torch.float32), prior_noise.to(device, torch.float32))
        kwargs = dict(
            noise_scale=noise.noise_scale,
            length_scale=noise.length_scale,
            noise_scale_w=noise.noise_scale_w,
            speaker_id=None if speaker_id is None else speaker_id.to(device),
        )
        return args, kwargs

    @torch.inference_mode()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        args, kwargs = self._model_inputs(request)
        audio, audio_lengths, durations = self.model(*args, **kwargs)
        return SynthesisResult(audio.float().cpu(), audio_lengths.cpu(), self.sample_rate_hz, durations=durations.cpu())

    @torch.inference_mode()
    def decoder_latent(self, request: SynthesisRequest) -> DecoderLatent:
        """The decoder's input for a request (same noise as ``synthesize``), on the voice's device."""
        args, kwargs = self._model_inputs(request)
        return self.model.infer_latent(*args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a converted voice (.safetensors + .onnx.json).")
    parser.add_argument("--voice", default="bundled:joe", help="bundled:joe or a Piper .onnx voice")
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    parser.add_argument("--out", required=True, help="<name>.safetensors")
    args = parser.parse_args()
    if not args.out.endswith(".safetensors"):
        parser.error(f"--out {args.out!r}: the name must end in .safetensors")
    path = save_converted_voice(args.voice, Path(args.out), getattr(torch, args.dtype))
    print(f"{path} ({path.stat().st_size / 2**20:.1f} MiB) and {_config_beside(path).name}")


if __name__ == "__main__":
    main()
