"""A training run's whole state (models, optimizers, step) as safetensors shards of bounded size.

A long run goes in chunks on a GPU machine that returns files of at most 16 MiB each; the student,
the discriminator and both optimizers' moments together are several times that. Shards also load
without executing pickled code, unlike ``torch.save`` of an optimizer's state.

    save_state(directory, {"model": m.state_dict(), "optimizer": opt.state_dict(), "step": 1200})
    state = load_state(directory)  # the same nested dicts, lists and tensors back

The tree's non-tensor leaves (step counts, param_groups' hyperparameters) travel as JSON in the
first shard's metadata, tensors by their path in the tree. Dict keys keep their type (an
optimizer's state is keyed by int), which plain JSON would turn into strings.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from core.atomic_io import atomic_write

SHARD_PATTERN = "state-{index:02d}-of-{count:02d}.safetensors"
DEFAULT_SHARD_BYTES = 15 * 2**20  # under the 16 MiB a GPU call returns per file


def _encode(value, tensors: dict[str, torch.Tensor], path: str):
    """The JSON-able skeleton of ``value``; tensors go into ``tensors`` under their path."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().cpu().contiguous()
        return {"tensor": path}
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"state key {key!r} at {path or '/'}: only str and int keys are supported")
        return {"dict": [[key, _encode(item, tensors, f"{path}/{key}")] for key, item in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"list": [_encode(item, tensors, f"{path}/{i}") for i, item in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"state leaf at {path or '/'} is a {type(value).__name__}: only tensors, "
                    "dicts, lists and JSON scalars can be saved")


def _decode(skeleton: dict, tensors: dict[str, torch.Tensor]):
    if "tensor" in skeleton:
        return tensors[skeleton["tensor"]]
    if "dict" in skeleton:
        return {key: _decode(item, tensors) for key, item in skeleton["dict"]}
    if "list" in skeleton:
        return [_decode(item, tensors) for item in skeleton["list"]]
    return skeleton["value"]


def _shards(directory: Path) -> list[Path]:
    return sorted(directory.glob("state-*-of-*.safetensors"))


def save_state(directory: Path, state: dict, max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[Path]:
    """Write ``state`` into ``directory`` as shards of at most ``max_shard_bytes`` of tensor data each.

    Each shard is written atomically and stale shards of an earlier save are removed afterwards,
    so an interrupted save leaves either the old set or a set ``load_state`` refuses (mixed counts).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _encode(state, tensors, "")
    groups: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if size > max_shard_bytes:
            raise ValueError(f"tensor {name} is {size} bytes, over the {max_shard_bytes}-byte shard limit")
        if used + size > max_shard_bytes:
            groups.append({})
            used = 0
        groups[-1][name] = tensor
        used += size
    written = []
    for index, group in enumerate(groups):
        path = directory / SHARD_PATTERN.format(index=index, count=len(groups))
        metadata = {"skeleton": json.dumps(skeleton)} if index == 0 else {}
        atomic_write(path, lambda tmp, group=group, metadata=metadata: save_file(group, tmp, metadata=metadata))
        written.append(path)
    for stale in set(_shards(directory)) - set(written):
        os.remove(stale)
    return written


def has_state(directory: Path) -> bool:
    return Path(directory).is_dir() and bool(_shards(Path(directory)))


def load_state(directory: Path, device: str | torch.device = "cpu") -> dict:
    """The tree ``save_state`` wrote, tensors on ``device``; a missing or mixed set of shards is an error."""
    directory = Path(directory)
    shards = _shards(directory)
    if not shards:
        raise FileNotFoundError(f"no state shards (state-NN-of-NN.safetensors) in {directory}")
    counts = {path.name.split("-of-")[1] for path in shards}
    expected = [SHARD_PATTERN.format(index=i, count=len(shards)) for i in range(len(shards))]
    if len(counts) != 1 or [p.name for p in shards] != expected:
        raise ValueError(f"{directory} holds an incomplete or mixed set of state shards: "
                         f"{[p.name for p in shards]}")
    with safe_open(str(shards[0]), framework="pt") as handle:
        skeleton = json.loads(handle.metadata()["skeleton"])
    tensors: dict[str, torch.Tensor] = {}
    for path in shards:
        tensors.update(load_file(str(path), device=str(device)))
    return _decode(skeleton, tensors)
