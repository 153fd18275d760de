"""A Piper voice in PyTorch behind the common TTSModel interface, with a safetensors cache.

    voice = PiperVoice.load("bundled:joe")                 # or a path to any Piper .onnx voice
    result = voice.synthesize(SynthesisRequest.from_sequences(voice.text_to_sequences("Hi.")))

The first load converts the ONNX graph (a few seconds); later loads read the cached
safetensors file, keyed by the voice file's content hash.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import onnx
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from models.interface import PhonemeSequence, SynthesisRequest, SynthesisResult
from models.piper.importer import onnx_to_state_dict
from models.piper.vits import PiperVits, VitsHyperParams
from models.piper.voice_files import PiperVoiceFiles
from models.text.espeak_frontend import EspeakFrontend

DEFAULT_CACHE_DIR = Path(os.environ.get("TTS_COMPRESS_CACHE", Path.home() / ".cache" / "tts-compress"))


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _hyperparams_from_json(text: str) -> VitsHyperParams:
    fields = json.loads(text)
    fields["resblock_dilations"] = tuple(tuple(d) for d in fields["resblock_dilations"])
    for key in ("upsample_rates", "upsample_kernel_sizes", "resblock_kernel_sizes"):
        fields[key] = tuple(fields[key])
    return VitsHyperParams(**fields)


def load_converted_weights(files: PiperVoiceFiles, cache_dir: Path = DEFAULT_CACHE_DIR):
    """(hyperparams, state dict) for a voice, converting and caching on first use."""
    cache_path = Path(cache_dir) / f"{files.onnx_path.stem}-{_file_digest(files.onnx_path)}.safetensors"
    if cache_path.is_file():
        state = load_file(cache_path)
        with open(cache_path, "rb") as handle:  # safetensors header: 8-byte length, then JSON
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        return _hyperparams_from_json(header["__metadata__"]["hyperparams"]), state
    hp, state = onnx_to_state_dict(onnx.load(str(files.onnx_path)))
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the target, then rename: a crash never leaves a half-written cache file.
    fd, tmp = tempfile.mkstemp(dir=cache_path.parent, suffix=".tmp")
    os.close(fd)
    save_file(state, tmp, metadata={"hyperparams": json.dumps(asdict(hp)), "source": str(files.onnx_path)})
    os.replace(tmp, cache_path)
    return hp, state


class PiperVoice(nn.Module):
    """Piper VITS voice: frontend + PyTorch synthesizer."""

    def __init__(self, model: PiperVits, frontend: EspeakFrontend, sample_rate_hz: int):
        super().__init__()
        self.model = model
        self.frontend = frontend
        self.sample_rate_hz = sample_rate_hz

    @classmethod
    def load(cls, voice: str | Path = "bundled:joe", cache_dir: Path = DEFAULT_CACHE_DIR) -> "PiperVoice":
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

    def text_to_sequences(self, text: str) -> list[PhonemeSequence]:
        return self.frontend(text)

    def parts(self) -> dict[str, nn.Module]:
        return {"encoder": self.model.enc_p, "duration": self.model.dp, "flow": self.model.flow,
                "decoder": self.model.dec}

    @torch.inference_mode()
    def synthesize(self, request: SynthesisRequest) -> SynthesisResult:
        if request.reference_embedding is not None or request.style is not None:
            raise ValueError("Piper voices take no reference_embedding or style; use speaker_id")
        hp = self.model.hp
        if hp.num_speakers > 1 and request.speaker_id is None:
            raise ValueError(f"this voice has {hp.num_speakers} speakers: set speaker_id")
        noise = request.noise
        batch, text_length = request.phoneme_ids.shape
        duration_noise, prior_noise = noise.draw(batch, text_length, hp.latent_channels)
        dtype = next(self.model.parameters()).dtype
        device = self.device
        audio, audio_lengths, durations = self.model(
            request.phoneme_ids.to(device),
            request.phoneme_lengths.to(device),
            duration_noise.to(device, dtype),
            prior_noise.to(device, dtype),
            noise_scale=noise.noise_scale,
            length_scale=noise.length_scale,
            noise_scale_w=noise.noise_scale_w,
            speaker_id=None if request.speaker_id is None else request.speaker_id.to(device),
        )
        return SynthesisResult(audio.float().cpu(), audio_lengths.cpu(), durations.cpu(), self.sample_rate_hz)
