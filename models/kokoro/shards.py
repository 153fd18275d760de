"""Kokoro weights as size-capped safetensors shards, for a machine that receives files by the
megabyte (float16 weights are 156 MiB; a shard stays under the cap). Reading needs only torch
and safetensors.

    write_shards(state, Path(".device/kokoro16"), "kokoro_v1_fp16", max_shard_mib=55)
    state = read_shards(sorted(Path(".device/kokoro16").glob("kokoro_v1_fp16-*.safetensors")))
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from core.atomic_io import atomic_write


def write_shards(state: dict[str, torch.Tensor], folder: Path, stem: str, max_shard_mib: float,
                 metadata: dict[str, str] | None = None) -> list[Path]:
    """Tensors in key order, a new shard whenever the next tensor would pass ``max_shard_mib``."""
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key in sorted(state):
        tensor = state[key].contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > max_shard_mib * 2 ** 20:
            groups.append({})
            size = 0
        groups[-1][key] = tensor
        size += nbytes
    paths = []
    for index, group in enumerate(groups, start=1):
        path = Path(folder) / f"{stem}-{index:05d}-of-{len(groups):05d}.safetensors"
        atomic_write(path, lambda tmp, group=group: save_file(group, tmp, metadata=metadata or {}))
        paths.append(path)
    return paths


def read_shards(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The union of the shards' tensors; a key in two shards is refused."""
    state: dict[str, torch.Tensor] = {}
    for path in paths:
        shard = load_file(Path(path))
        repeated = sorted(set(shard) & set(state))
        if repeated:
            raise ValueError(f"{path} repeats tensors {repeated[:4]} of an earlier shard")
        state.update(shard)
    return state
