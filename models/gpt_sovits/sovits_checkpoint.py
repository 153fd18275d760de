"""Load a GPT-SoVITS SoVITS (v2) weights file, or build one at full size from a manifest.

    from models.gpt_sovits.sovits_checkpoint import load_sovits_checkpoint, sovits_from_manifest
    checkpoint = load_sovits_checkpoint("SoVITS_weights_v2/voice_e8_s96.pth")   # .model, .config, .hparams
    checkpoint = sovits_from_manifest("../shared/fixtures/gpt_sovits_v2/manifest_official_sovits.json")

An official ``.pth`` is a torch zip holding ``{"weight", "config", "info"}``: fp16 tensors without a
key prefix and without ``enc_q``, and the training hyper-parameters pickled as a ``utils.HParams``
object. No pickled code runs: the file is read with ``weights_only=True`` and the single extra
global ``utils.HParams`` is mapped to ``OfficialHParams``, a plain attribute holder; any other
global is refused. Newer trainers overwrite the zip magic ``PK`` with a two-byte version tag, which
is put back in memory before unzipping. Weight-normed convs (``weight_g``/``weight_v``, norm over
every dimension but 0, which for ``ConvTranspose1d`` is the input channel) are folded into plain
weights; tensors are upcast exactly to float32; shapes come from the file's config and tensors.
"""
from __future__ import annotations

import io
import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from models.gpt_sovits.sovits import SovitsConfig, SovitsSynthesizer

ZIP_MAGIC = b"PK"
# process_ckpt.py's head-to-version table: the tag that replaces "PK" names the model kind.
VERSION_TAGS = {
    b"00": "v1", b"01": "v2", b"02": "v3", b"03": "v3 LoRA", b"04": "v4 LoRA", b"05": "v2Pro", b"06": "v2ProPlus",
}
SUPPORTED_TAGGED_VERSIONS = ("v1", "v2")  # the same SynthesizerTrn; v3/v4/v2Pro add modules built elsewhere
POSTERIOR_ENCODER_PREFIX = "enc_q."  # training-only; trained files drop it, pretrained base files keep it
CODEBOOK_TRAINING_BUFFERS = ("inited", "cluster_size", "embed_avg")  # EMA state; lookups read only ``embed``
WEIGHT_NORM_SUFFIXES = (".weight_g", ".weight_v")


class SovitsCheckpointError(ValueError):
    """A SoVITS weights file that cannot be read safely or does not fit the network its config describes."""


class OfficialHParams:
    """Stands in for the official ``utils.HParams`` while unpickling: pickle restores the saved
    attributes into ``__dict__`` and nothing else runs."""


@dataclass
class SovitsCheckpoint:
    model: SovitsSynthesizer  # eval mode, float32, on the CPU
    config: SovitsConfig
    hparams: dict  # the file's whole config as plain dicts (train, data, model, ...)
    info: str  # e.g. "8epoch_96iteration"
    version_tag: str | None  # the kind a tagged file names ("v2"), None for a plain zip


def _plain(value: object) -> object:
    """OfficialHParams trees -> nested dicts; other values unchanged."""
    if isinstance(value, OfficialHParams):
        return {key: _plain(item) for key, item in vars(value).items()}
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _zip_bytes(path: Path) -> tuple[bytes, str | None]:
    """The file's bytes with the zip magic restored, and the version its tag names (None if untagged)."""
    data = path.read_bytes()
    head = data[:2]
    if head == ZIP_MAGIC:
        return data, None
    if head not in VERSION_TAGS:
        raise SovitsCheckpointError(
            f"{path} starts with {head!r}: not a SoVITS weights file (expected the zip magic b'PK' or a "
            f"version tag among {sorted(tag.decode() for tag in VERSION_TAGS)})")
    version = VERSION_TAGS[head]
    if version not in SUPPORTED_TAGGED_VERSIONS:
        raise SovitsCheckpointError(
            f"{path} is tagged as a SoVITS {version} file; only {' and '.join(SUPPORTED_TAGGED_VERSIONS)} "
            "synthesizers are supported here")
    return ZIP_MAGIC + data[2:], version


def read_sovits_file(path: str | Path) -> tuple[dict[str, torch.Tensor], dict, str, str | None]:
    """(raw official state dict, config as plain dicts, info, version tag) of a SoVITS ``.pth``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SoVITS weights file {path} does not exist (expected a GPT-SoVITS *.pth file)")
    data, version_tag = _zip_bytes(path)
    try:
        with torch.serialization.safe_globals([(OfficialHParams, "utils.HParams")]):
            content = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise SovitsCheckpointError(
            f"refusing {path}: its pickle names a Python global other than utils.HParams, and loading it could "
            f"run code ({error})") from error
    except Exception as error:  # torch raises RuntimeError, EOFError, ... for truncated or corrupted zips
        raise SovitsCheckpointError(
            f"cannot read {path} as a SoVITS weights file (a torch zip of weight/config/info); is the file "
            f"complete? {type(error).__name__}: {error}") from error
    if not isinstance(content, Mapping) or not {"weight", "config"} <= set(content):
        found = sorted(content) if isinstance(content, Mapping) else type(content).__name__
        raise SovitsCheckpointError(f"{path}: expected a mapping with 'weight', 'config' and 'info', found {found}")
    config = _plain(content["config"])
    if not isinstance(config, dict) or not {"data", "model", "train"} <= set(config):
        raise SovitsCheckpointError(f"{path}: its config lacks the 'data', 'model' and 'train' sections")
    return dict(content["weight"]), config, str(content.get("info", "")), version_tag


def config_from_official(hparams: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> SovitsConfig:
    """The network's sizes from an official config and the official tensor shapes. Sizes the official
    code derives from its version rather than its config (vocabulary, reference bins, SSL width,
    codebook) are read off the tensors."""
    try:
        data, model = hparams["data"], hparams["model"]
        codebook_keys = [key for key in shapes if key.startswith("quantizer.vq.layers.") and key.endswith(".embed")]
        codebook_size, ssl_dim = shapes["quantizer.vq.layers.0._codebook.embed"]
        return SovitsConfig(
            phoneme_vocab_size=shapes["enc_p.text_embedding.weight"][0],
            reference_bins=shapes["ref_enc.spectral.0.fc.weight"][1],
            inter_channels=int(model["inter_channels"]),
            hidden_channels=int(model["hidden_channels"]),
            filter_channels=int(model["filter_channels"]),
            n_heads=int(model["n_heads"]),
            n_layers=int(model["n_layers"]),
            kernel_size=int(model["kernel_size"]),
            resblock=str(model["resblock"]),
            resblock_kernel_sizes=tuple(int(k) for k in model["resblock_kernel_sizes"]),
            resblock_dilation_sizes=tuple(tuple(int(d) for d in ds) for ds in model["resblock_dilation_sizes"]),
            upsample_rates=tuple(int(r) for r in model["upsample_rates"]),
            upsample_initial_channel=int(model["upsample_initial_channel"]),
            upsample_kernel_sizes=tuple(int(k) for k in model["upsample_kernel_sizes"]),
            gin_channels=int(model["gin_channels"]),
            ssl_dim=ssl_dim,
            codebook_size=codebook_size,
            n_codebooks=len(codebook_keys),
            sample_rate_hz=int(data["sampling_rate"]),
            filter_length=int(data["filter_length"]),
            hop_length=int(data["hop_length"]),
            win_length=int(data["win_length"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise SovitsCheckpointError(
            f"the SoVITS config or weights lack what the synthesizer's sizes are read from: {error!r}") from error


def _fold_weight_norm(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``<name>.weight_g``/``<name>.weight_v`` -> ``<name>.weight = g * v / ||v||``, the norm over
    every dimension but 0 (legacy ``weight_norm(dim=0)``)."""
    folded = {key: value for key, value in weights.items() if not key.endswith(WEIGHT_NORM_SUFFIXES)}
    for key, g in weights.items():
        if not key.endswith(".weight_g"):
            continue
        name = key[: -len(".weight_g")]
        if name + ".weight_v" not in weights:
            raise SovitsCheckpointError(f"{key} has no matching {name}.weight_v")
        v = weights[name + ".weight_v"]
        norm = v.norm(dim=tuple(range(1, v.dim())), keepdim=True)  # (out or, for ConvTranspose, in, 1, 1)
        folded[name + ".weight"] = g * v / norm
    orphans = [key for key in weights if key.endswith(".weight_v") and key[:-2] + "_g" not in weights]
    if orphans:
        raise SovitsCheckpointError(f"weight_v without weight_g: {orphans[:3]}")
    return folded


def official_to_state_dict(weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An official SoVITS state dict -> ``SovitsSynthesizer``'s: float32, ``enc_q`` dropped, weight
    norms folded, codebook training buffers dropped after checking the codebook was initialised."""
    state = {key: value.float() for key, value in weights.items() if not key.startswith(POSTERIOR_ENCODER_PREFIX)}
    for key in [key for key in state if key.endswith("._codebook.inited")]:
        if not bool(state[key].any()):
            raise SovitsCheckpointError(
                f"{key} is 0: this codebook was never initialised (the official forward pass would run k-means "
                "on first use), so its codes mean nothing")
    state = {key: value for key, value in state.items() if key.rsplit(".", 1)[-1] not in CODEBOOK_TRAINING_BUFFERS}
    return _fold_weight_norm(state)


def load_state_dict_strictly(model: SovitsSynthesizer, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Every key present with its shape, nothing extra; errors list what differs."""
    expected = model.state_dict()
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    mismatched = [
        f"{key}: file {tuple(state[key].shape)} vs model {tuple(expected[key].shape)}"
        for key in expected if key in state and state[key].shape != expected[key].shape
    ]
    if missing or unexpected or mismatched:
        raise SovitsCheckpointError(
            f"{source} does not fit a SoVITS v2 synthesizer of its config: {len(missing)} missing "
            f"{missing[:5]}, {len(unexpected)} unexpected {unexpected[:5]}, {len(mismatched)} shape mismatches "
            f"{mismatched[:5]}")
    model.load_state_dict(state, strict=True)


def _build(weights: Mapping[str, torch.Tensor], hparams: dict, source: str) -> tuple[SovitsSynthesizer, SovitsConfig]:
    shapes = {key: tuple(value.shape) for key, value in weights.items()}
    config = config_from_official(hparams, shapes)
    model = SovitsSynthesizer(config)
    load_state_dict_strictly(model, official_to_state_dict(weights), source)
    return model.eval(), config


def load_sovits_checkpoint(path: str | Path) -> SovitsCheckpoint:
    """An official SoVITS v2 ``.pth`` -> the synthesizer with its weights, in float32 on the CPU."""
    weights, hparams, info, version_tag = read_sovits_file(path)
    model, config = _build(weights, hparams, str(path))
    return SovitsCheckpoint(model, config, hparams, info, version_tag)


def sovits_from_manifest(path: str | Path, seed: int = 0) -> SovitsCheckpoint:
    """A full-size synthesizer with random weights, drawn for exactly the keys and shapes a trained
    official file holds (``manifest_official_sovits.json``) and loaded through the same conversion
    as a real file, so a missing or extra key fails here as it would there. Speed and memory are
    real; the audio is not speech."""
    manifest = json.loads(Path(path).read_text())
    entries = {key: entry for key, entry in manifest["weight"].items() if entry.get("in_trained_weights_file", True)}
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for key, entry in entries.items():
        shape = tuple(entry["shape"])
        if key.endswith(("._codebook.inited", ".gamma", ".weight_g")):
            weights[key] = torch.ones(shape, dtype=torch.float16)  # an initialised codebook, unit gains
        else:
            weights[key] = (0.02 * torch.randn(shape, generator=generator)).half()
    expected_elements = manifest.get("total_state_dict_elements_in_trained_weights_file")
    elements = sum(value.numel() for value in weights.values())
    if expected_elements is not None and elements != expected_elements:
        raise SovitsCheckpointError(f"{path}: its keys hold {elements} elements but it declares {expected_elements}")
    model, config = _build(weights, manifest["config"], str(path))
    return SovitsCheckpoint(model, config, manifest["config"], "random weights from a manifest", None)
