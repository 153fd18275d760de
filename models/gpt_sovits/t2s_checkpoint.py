"""Load a GPT-SoVITS v2 GPT (text-to-semantic) checkpoint, or build one at full size from a manifest.

    from models.gpt_sovits.t2s_checkpoint import load_t2s_checkpoint, t2s_from_manifest
    checkpoint = load_t2s_checkpoint("GPT_weights_v2/voice-e15.ckpt")   # .model, .config, .info
    model = t2s_from_manifest("../shared/fixtures/gpt_sovits_v2/manifest_official_t2s.json")

An official ``.ckpt`` is a torch zip holding ``{"weight", "config", "info"}``: fp16 tensors whose
keys carry the Lightning wrapper's ``model.`` prefix, and the training yaml as a plain dict. It is
read with ``weights_only=True`` (no pickled code runs); the network's shapes come from the file's
own ``config["model"]``; tensors are upcast exactly to float32 and loaded strictly.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from models.gpt_sovits.t2s import T2SConfig, Text2SemanticModel

KEY_PREFIX = "model."  # the Lightning module wraps the decoder as ``self.model``
# The official callers pass early_stop_num = 50 * max_sec (their ``hz`` is 50 although tokens
# come at 25 per second), so max_sec = 54 allows up to 2700 tokens before the 1500-step loop limit.
EARLY_STOP_TOKENS_PER_MAX_SEC = 50


class T2SCheckpointError(ValueError):
    """A GPT checkpoint that cannot be read or does not fit the network its config describes."""


@dataclass
class T2SCheckpoint:
    model: Text2SemanticModel  # eval mode, float32, on the CPU
    config: dict  # the file's whole config (training yaml plus web UI keys)
    info: str  # e.g. "GPT-e15"

    @property
    def early_stop_num(self) -> int:
        """The official callers' ``early_stop_num`` from ``config["data"]["max_sec"]``; -1 (no early
        stop) when the file has no max_sec."""
        max_sec = self.config.get("data", {}).get("max_sec")
        return -1 if max_sec is None else int(EARLY_STOP_TOKENS_PER_MAX_SEC * max_sec)


def read_t2s_file(path: str | Path) -> tuple[dict[str, torch.Tensor], dict, str]:
    """(state dict with ``model.`` stripped and float32 tensors, config, info) of a ``.ckpt`` file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GPT checkpoint {path} does not exist (expected a GPT-SoVITS *.ckpt file)")
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises RuntimeError, UnpicklingError, EOFError... for broken files
        raise T2SCheckpointError(
            f"cannot read {path} as a GPT-SoVITS GPT checkpoint (a torch zip of weight/config/info readable "
            f"with weights_only=True); is the file complete? {type(error).__name__}: {error}") from error
    if not isinstance(content, Mapping) or not {"weight", "config"} <= set(content):
        found = sorted(content) if isinstance(content, Mapping) else type(content).__name__
        raise T2SCheckpointError(f"{path}: expected a mapping with 'weight', 'config' and 'info', found {found}")
    weight, config = content["weight"], content["config"]
    if not isinstance(config, Mapping) or not isinstance(config.get("model"), Mapping):
        raise T2SCheckpointError(f"{path}: config must be a dict with a 'model' section, got {type(config).__name__}")
    unprefixed = sorted(key for key in weight if not key.startswith(KEY_PREFIX))
    if unprefixed:
        raise T2SCheckpointError(f"{path}: every weight key should start with {KEY_PREFIX!r}; these do not: "
                                 f"{unprefixed[:5]}{' ...' if len(unprefixed) > 5 else ''}")
    state_dict = {key[len(KEY_PREFIX):]: tensor.float() if tensor.is_floating_point() else tensor
                  for key, tensor in weight.items()}
    return state_dict, dict(config), str(content.get("info", ""))


def load_state_dict_strictly(model: Text2SemanticModel, state_dict: Mapping[str, torch.Tensor], source: str) -> None:
    """Load every tensor; missing, unexpected or misshapen keys raise one error listing them all."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    misshapen = sorted(f"{key} {tuple(state_dict[key].shape)} (network: {tuple(expected[key].shape)})"
                       for key in set(expected) & set(state_dict) if state_dict[key].shape != expected[key].shape)
    if missing or unexpected or misshapen:
        raise T2SCheckpointError(f"{source} does not fit the T2S network its config describes ({model.config}): "
                                 f"missing keys {missing}; unexpected keys {unexpected}; wrong shapes {misshapen}")
    model.load_state_dict(state_dict, strict=True)


def load_t2s_checkpoint(path: str | Path) -> T2SCheckpoint:
    state_dict, config, info = read_t2s_file(path)
    try:
        t2s_config = T2SConfig.from_checkpoint_config(config["model"])
    except ValueError as error:
        raise T2SCheckpointError(f"{path}: {error}") from error
    model = Text2SemanticModel(t2s_config)
    load_state_dict_strictly(model, state_dict, str(path))
    return T2SCheckpoint(model.eval(), config, info)


def t2s_from_manifest(manifest_json_path: str | Path, seed: int = 0) -> Text2SemanticModel:
    """A full-size model with random weights (the constructors' own initialisation, seeded) built
    from a manifest's ``config["model"]``; its state-dict keys and shapes must equal the manifest's."""
    manifest = json.loads(Path(manifest_json_path).read_text())
    prefix = manifest.get("key_prefix", KEY_PREFIX)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Text2SemanticModel(T2SConfig.from_checkpoint_config(manifest["config"]["model"]))
    listed = {key.removeprefix(prefix): tuple(entry["shape"])
              for key, entry in manifest["weight"].items()}
    built = {key: tuple(tensor.shape) for key, tensor in model.state_dict().items()}
    if listed != built:
        missing = sorted(set(listed) - set(built))
        unexpected = sorted(set(built) - set(listed))
        misshapen = sorted(f"{key} {built[key]} (manifest: {listed[key]})"
                           for key in set(built) & set(listed) if built[key] != listed[key])
        raise T2SCheckpointError(f"{manifest_json_path}: the network built from its config differs from its key "
                                 f"list: missing keys {missing}; unexpected keys {unexpected}; "
                                 f"wrong shapes {misshapen}")
    return model.eval()
