"""Loaders for EmotiVoice's released generator, and full-size random weights from the manifests
(torch only, so a benchmark machine needs nothing else; the style encoder's are in
models/emotivoice/style_checkpoints.py).

* ``g_00140000``: ``{'generator': state_dict}`` of the acoustic model + HiFi-GAN, weight norm under
  the legacy ``weight_g/weight_v`` names or torch's ``parametrizations.weight.original0/1``.

Files are read with ``torch.load(weights_only=True)``: no pickled code runs. Loading is strict
apart from the training-only alignment module, whose keys are dropped by name.

Without the user's files, ``random_generator`` builds the full-size model from the manifest in
models/emotivoice/data/ (speed and memory real, quality none).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from models.emotivoice.config import GeneratorConfig
from models.emotivoice.generator import EmotiVoiceGenerator

DATA_DIR = Path(__file__).resolve().parent / "data"
GENERATOR_MANIFEST = DATA_DIR / "manifest_official_generator.json"

TRAINING_ONLY_PREFIX = "am.alignment_module."  # the aligner JETS trains with; inference never runs it
DDP_PREFIX = "module."
LEGACY_WEIGHT_NORM = {".weight_g": ".parametrizations.weight.original0",
                      ".weight_v": ".parametrizations.weight.original1"}
# Random full-size weights speak about 4 frames (64 ms) per symbol, so a 15-character Mandarin
# sentence (43 symbols) lasts 2.8 s as spoken and the vocoder's share is realistic: round(exp(log 5) - 1) = 4.
RANDOM_LOG_DURATION_BIAS = math.log(5.0)


def read_checkpoint(path: Path, top_key: str, what: str) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {path} not found")
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or top_key not in checkpoint:
        found = sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(f"{path} is not an EmotiVoice {what}: expected a dict with {top_key!r}, found {found}")
    return checkpoint[top_key]


def normalize_generator_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The released generator's keys as our module names them: legacy weight-norm names mapped to
    torch's parametrization names, a stray ``module.`` prefix removed, the aligner dropped."""
    normalized = {}
    for key, tensor in state.items():
        key = key.removeprefix(DDP_PREFIX)
        if key.startswith(TRAINING_ONLY_PREFIX):
            continue
        for legacy, current in LEGACY_WEIGHT_NORM.items():
            if key.endswith(legacy):
                key = key[: -len(legacy)] + current
        normalized[key] = tensor
    return normalized


def _table_rows(state: dict[str, torch.Tensor], key: str) -> int:
    if key not in state:
        raise KeyError(f"generator weights lack {key!r}: not an EmotiVoice g_* checkpoint")
    return int(state[key].shape[0])


def generator_from_state(state: dict[str, torch.Tensor], config: dict) -> EmotiVoiceGenerator:
    """A generator in eval mode from a released-layout state dict and the official yaml's content;
    vocabulary and speaker-table sizes come from the weights' own tables."""
    state = normalize_generator_state(state)
    generator_config = GeneratorConfig.from_dict(config, n_vocab=_table_rows(state, "am.src_word_emb.weight"),
                                                 n_speaker=_table_rows(state, "am.spk_tokenizer.weight"))
    model = EmotiVoiceGenerator(generator_config)
    load_strict(model, state, "generator")
    return model.eval()


def load_generator(checkpoint_path: Path, config: dict) -> EmotiVoiceGenerator:
    """``g_00140000`` (``{'generator': ...}``) with the yaml content of its config/joint/config.yaml."""
    return generator_from_state(read_checkpoint(checkpoint_path, "generator", "generator checkpoint"), config)


def load_strict(model: torch.nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong_shape = sorted(key for key in set(state) & set(expected) if state[key].shape != expected[key].shape)
    if missing or unexpected or wrong_shape:
        def some(keys):
            return f"{len(keys)} ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})"
        shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(expected[k].shape)}" for k in wrong_shape[:4]]
        raise ValueError(f"{what} weights do not fit the model built from its config: missing {some(missing)}, "
                         f"unexpected {some(unexpected)}, wrong shape {len(wrong_shape)} {shapes}")
    model.load_state_dict(state, strict=True)


def read_manifest(path: Path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def random_state(manifest_state: dict[str, dict], seed: int) -> dict[str, torch.Tensor]:
    """Random tensors of a manifest's shapes and dtypes, scaled like a trained network's: norms'
    weights (the only 1-d weights) 1 and biases 0, weight-norm magnitudes equal to |v|, position ids 0..N-1, every other
    tensor N(0, 1/fan_in)."""
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for key, entry in manifest_state.items():
        shape = tuple(entry["shape"])
        if entry["dtype"] == "int64":
            state[key] = torch.arange(shape[-1]).expand(shape).clone()
        elif key.endswith("alpha") or (len(shape) == 1 and key.endswith("weight")):  # norms' scales
            state[key] = torch.ones(shape)
        elif key.endswith("bias"):
            state[key] = torch.zeros(shape)
        elif not key.endswith("weight_g") and not key.endswith("original0"):
            fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
            state[key] = torch.randn(shape, generator=generator) / math.sqrt(fan_in)
    for key, entry in manifest_state.items():  # magnitudes after their directions, so |w| = |v|
        for magnitude, direction in (("weight_g", "weight_v"), ("original0", "original1")):
            if key.endswith(magnitude):
                v = state[key[: -len(magnitude)] + direction]
                state[key] = v.flatten(1).norm(dim=1).view(tuple(entry["shape"]))
    return state


def random_generator(seed: int = 0, manifest_path: Path = GENERATOR_MANIFEST) -> EmotiVoiceGenerator:
    """The full-size released generator layout with random weights (53.3 M parameters)."""
    manifest = read_manifest(manifest_path)
    state = random_state(manifest["state_dict"], seed)
    state["am.duration_predictor.linear.weight"] = state["am.duration_predictor.linear.weight"] * 0.1
    state["am.duration_predictor.linear.bias"] = torch.full_like(state["am.duration_predictor.linear.bias"],
                                                                 RANDOM_LOG_DURATION_BIAS)
    return generator_from_state(state, manifest["config_used"])
