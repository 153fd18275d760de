"""Importing the joe voice's ONNX graph into PiperVits, and the safetensors cache in front of it.

    python -m pytest -q tests/test_importer.py
"""
from __future__ import annotations

import json
import pickle
import time

import onnx
import pytest
import torch

import models.piper.voice as voice_module
from models.piper.vits import PiperVits
from models.piper.voice import load_converted_weights
from models.piper.voice_files import PiperVoiceFiles

pytestmark = pytest.mark.slow  # loads the real voice

# Piper's "medium" training config (piper_train vits/config.py), which the joe voice was trained with.
PIPER_MEDIUM = {
    "num_symbols": 256,
    "hidden_channels": 192,
    "filter_channels": 768,
    "n_layers": 6,
    "n_heads": 2,
    "window_size": 4,
    "latent_channels": 192,
    "upsample_rates": (8, 8, 4),
    "upsample_kernel_sizes": (16, 16, 8),
    "resblock_type": "2",
    "resblock_kernel_sizes": (3, 5, 7),
    "resblock_dilations": ((1, 2), (2, 6), (3, 12)),
    "num_speakers": 1,
}


@pytest.fixture(scope="module")
def joe_files() -> PiperVoiceFiles:
    return PiperVoiceFiles.resolve("bundled:joe")


@pytest.fixture(scope="module")
def converted(joe_files, tmp_path_factory):
    """(cache_dir, hyperparams, state dict) from a first, converting load into an empty cache."""
    cache_dir = tmp_path_factory.mktemp("cache")
    hp, state = load_converted_weights(joe_files, cache_dir)
    return cache_dir, hp, state


def test_hyperparameters_are_piper_medium(converted):
    _, hp, _ = converted
    read = {name: getattr(hp, name) for name in PIPER_MEDIUM}
    assert read == PIPER_MEDIUM
    assert hp.hop_length == 256  # 22.05 kHz medium voices: 8 * 8 * 4 samples per frame


def test_state_dict_loads_strictly(converted):
    _, hp, state = converted
    model = PiperVits(hp)
    result = model.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys


def test_second_load_is_a_fast_cache_hit(converted, joe_files, monkeypatch):
    cache_dir, hp, state = converted
    assert len(list(cache_dir.glob("*.safetensors"))) == 1

    def must_not_convert(*args, **kwargs):
        raise AssertionError("a cache hit must not read or convert the ONNX graph again")

    monkeypatch.setattr(voice_module, "onnx_to_state_dict", must_not_convert)
    monkeypatch.setattr(onnx, "load", must_not_convert)
    started = time.perf_counter()
    cached_hp, cached_state = load_converted_weights(joe_files, cache_dir)
    elapsed_s = time.perf_counter() - started

    assert elapsed_s < 1.0, f"cache hit took {elapsed_s:.2f} s"
    assert cached_hp == hp
    assert cached_state.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(cached_state[name], tensor), name


def test_cache_file_is_safetensors_and_loads_without_pickle(converted, joe_files, monkeypatch):
    cache_dir, _, state = converted
    (cache_path,) = cache_dir.glob("*.safetensors")
    with open(cache_path, "rb") as handle:  # safetensors: 8-byte header length, JSON header, raw tensors
        header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
    assert set(header) - {"__metadata__"} == set(state)

    def no_pickle(*args, **kwargs):
        raise AssertionError("the cache must load without unpickling anything")

    for module, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(module, name, no_pickle)
    load_converted_weights(joe_files, cache_dir)


def test_missing_voice_file_is_named(tmp_path):
    missing = tmp_path / "no-such-voice.onnx"
    with pytest.raises(FileNotFoundError, match="no-such-voice.onnx"):
        PiperVoiceFiles.resolve(missing)


def test_missing_voice_config_is_named(tmp_path):
    onnx_path = tmp_path / "voice.onnx"
    onnx_path.write_bytes(b"not a graph")  # only existence is checked before the config
    with pytest.raises(FileNotFoundError, match=r"voice\.onnx\.json"):
        PiperVoiceFiles.resolve(onnx_path)
