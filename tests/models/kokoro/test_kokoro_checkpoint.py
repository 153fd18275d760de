"""The official kokoro-v1_0.pth layout: five sub-dicts, ``module.`` keys, weight_g/weight_v pairs,
InstanceNorm affine tensors absent (or at 1/0), pooler present but unused."""
from __future__ import annotations

import json

import pytest
import torch

from models.kokoro.checkpoint import (
    fold_weight_norm,
    load_model_state,
    model_state_from_official,
)
from models.kokoro.model import KokoroModel
from models.kokoro.release import MANIFEST_PATH, official_config
from models.kokoro.tiny import tiny_model


def _official_layout(model: KokoroModel) -> dict[str, dict[str, torch.Tensor]]:
    """A model's weights written the way kokoro-v1_0.pth stores them: every conv weight split into
    v := W, g := ||W|| (the loader folds whatever pairs it finds), ``module.`` keys."""
    checkpoint: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in model.state_dict().items():
        submodule, inner = key.split(".", 1)
        entries = checkpoint.setdefault(submodule, {})
        if inner.endswith(".weight") and value.dim() == 3:
            entries[f"module.{inner[:-7]}.weight_v"] = value.clone()
            entries[f"module.{inner[:-7]}.weight_g"] = value.flatten(1).norm(dim=1).view(-1, 1, 1).clone()
        else:
            entries[f"module.{inner}"] = value.clone()
    return checkpoint


def test_official_layout_round_trip():
    model = tiny_model(0)
    state = model_state_from_official(_official_layout(model))
    for key, value in model.state_dict().items():
        torch.testing.assert_close(state[key], value, rtol=1e-6, atol=1e-7)


def test_untrained_instance_norm_affines_and_pooler_are_accepted():
    model = tiny_model(0)
    checkpoint = _official_layout(model)
    checkpoint["decoder"]["module.encode.norm1.norm.weight"] = torch.ones(26)
    checkpoint["decoder"]["module.encode.norm1.norm.bias"] = torch.zeros(26)
    checkpoint["bert"]["module.pooler.weight"] = torch.zeros(32, 32)
    load_model_state(tiny_model(1), model_state_from_official(checkpoint))


def test_trained_instance_norm_affine_is_refused():
    checkpoint = _official_layout(tiny_model(0))
    checkpoint["decoder"]["module.encode.norm1.norm.weight"] = torch.full((26,), 1.5)
    with pytest.raises(ValueError, match="encode.norm1.norm.weight"):
        model_state_from_official(checkpoint)


def test_missing_key_is_named():
    checkpoint = _official_layout(tiny_model(0))
    del checkpoint["predictor"]["module.F0_proj.bias"]
    with pytest.raises(ValueError, match="predictor.F0_proj.bias"):
        load_model_state(tiny_model(1), model_state_from_official(checkpoint))


def test_zero_channel_folds_to_zero_not_nan():
    weight_v = torch.randn(3, 2, 5)
    weight_v[1] = 0
    folded = fold_weight_norm(torch.ones(3, 1, 1), weight_v)
    assert torch.isfinite(folded).all() and torch.all(folded[1] == 0)


def test_full_size_model_takes_every_official_key():
    """All 548 keys of the official v1.0 manifest (shapes only) load with nothing missing or unexpected."""
    manifest = json.loads(MANIFEST_PATH.read_text(encoding="utf-8"))
    checkpoint = {name: {entry["key"]: torch.ones(entry["shape"]) for entry in part["keys"]}
                  for name, part in manifest["submodules"].items()}
    assert sum(len(part) for part in checkpoint.values()) == manifest["totals"]["file_keys"] == 548
    model = load_model_state(KokoroModel(official_config()), model_state_from_official(checkpoint))
    assert sum(p.numel() for p in model.parameters()) > 80_000_000
