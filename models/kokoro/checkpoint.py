"""Load Kokoro weights in the official ``kokoro-v1_0.pth`` layout into ``KokoroModel``.

The file is a plain dict of five state dicts (bert, bert_encoder, predictor, text_encoder,
decoder) whose keys start with ``module.`` (saved under DataParallel). Weight-normalised convs
are stored as ``weight_g``/``weight_v``; they are folded into one weight g*v/||v|| here. Tensors
the file omits are defaults: the InstanceNorm affine pair (1 and 0, absent because it was never
trained) and non-persistent buffers. The ALBERT pooler is in the file but unused, so it is dropped.

    model = load_official_checkpoint(Path("kokoro-v1_0.pth"), KokoroConfig.from_json(Path("config.json")))
"""
from __future__ import annotations

from pathlib import Path

import torch

from models.kokoro.config import KokoroConfig
from models.kokoro.model import KokoroModel

SUBMODULES = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
DATA_PARALLEL_PREFIX = "module."
UNUSED_KEYS = ("bert.pooler.weight", "bert.pooler.bias")  # ALBERT pooler: Kokoro reads last_hidden_state only


def fold_weight_norm(weight_g: torch.Tensor, weight_v: torch.Tensor) -> torch.Tensor:
    """g * v / ||v||, the norm over every dim but 0 (out channels; in channels for ConvTranspose1d).
    A channel whose v is all zero (int8 rounding zeroes small channels) stays zero instead of 0/0."""
    norm = weight_v.flatten(1).norm(dim=1).view(-1, *([1] * (weight_v.dim() - 1)))
    return weight_g * weight_v / torch.where(norm > 0, norm, torch.ones_like(norm))


INSTANCE_NORM_SUFFIXES = (".norm.weight", ".norm.bias")  # AdaIN1d.norm: Kokoro's only sub-module named "norm"


def _check_default_instance_norm(name: str, tensor: torch.Tensor) -> None:
    """An AdaIN InstanceNorm affine tensor must sit at its untrained value (weight 1, bias 0)."""
    default = 1.0 if name.endswith("weight") else 0.0
    if not torch.all(tensor == default):
        raise ValueError(f"{name} is a trained InstanceNorm affine (not all {default}); this port's AdaIN has none")


def model_state_from_official(checkpoint: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The official file's five sub-dicts -> a ``KokoroModel`` state dict (folded, prefixed)."""
    unknown = sorted(set(checkpoint) - set(SUBMODULES))
    if unknown:
        raise ValueError(f"checkpoint has entries {unknown}; a Kokoro file holds only {list(SUBMODULES)}")
    state: dict[str, torch.Tensor] = {}
    for submodule in SUBMODULES:
        if submodule not in checkpoint:
            raise ValueError(f"checkpoint lacks the {submodule!r} entry; it holds {sorted(checkpoint)}")
        entries = {key.removeprefix(DATA_PARALLEL_PREFIX): value for key, value in checkpoint[submodule].items()}
        for key, value in entries.items():
            name = f"{submodule}.{key}"
            if key.endswith(".weight_v"):
                continue
            if key.endswith(".weight_g"):
                stem = key.removesuffix(".weight_g")
                if f"{stem}.weight_v" not in entries:
                    raise ValueError(f"checkpoint has {name} without its weight_v")
                state[f"{submodule}.{stem}.weight"] = fold_weight_norm(value.float(), entries[f"{stem}.weight_v"].float())
            elif key.endswith(INSTANCE_NORM_SUFFIXES):
                _check_default_instance_norm(name, value)
            elif key.endswith("position_ids"):
                continue  # a non-persistent buffer of ALBERT, rebuilt by the model
            elif name not in UNUSED_KEYS:
                state[name] = value.float()
    return state


def load_model_state(model: KokoroModel, state: dict[str, torch.Tensor]) -> KokoroModel:
    """Strict load that names every missing or unexpected key."""
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"Kokoro weights do not fit the config: missing {missing[:8]} ({len(missing)}), "
                         f"unexpected {unexpected[:8]} ({len(unexpected)})")
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_official_checkpoint(path: Path, config: KokoroConfig, stft_variant: str = "torch") -> KokoroModel:
    checkpoint = torch.load(Path(path), map_location="cpu", weights_only=True)
    return load_model_state(KokoroModel(config, stft_variant), model_state_from_official(checkpoint))
