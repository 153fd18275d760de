"""Recover Kokoro's float weights from the shipped int8 ONNX graph (kokoro-onnx's
``kokoro-v1.0.int8.onnx``), in the official ``kokoro-v1_0.pth`` layout.

``data/onnx_int8_mapping.json`` names, for each of the 546 official keys the graph holds (all but
the unused ALBERT pooler), the initializers it comes from and how:

* ``copy`` / ``transpose``: float32 tensors as stored (fused ORT ops keep LayerNorm and biases whole);
* ``dequantize``: (q - zero_point) * scale with one scale (embeddings, 1x1 projections);
* ``dequantize_columns_transpose``: MatMulInteger weights [in, out] with a scale and zero point per
  output column, transposed back to [out, in];
* ``lstm_weight`` / ``lstm_bias``: DynamicQuantizeLSTM's [dir, in, 4H] weights (one scale per
  direction) and [dir, 8H] = [b_ih | b_hh] biases, gates reordered from ONNX i,o,f,c to torch i,f,g,o;
* ``dequantize_weight_norm`` / ``copy_weight_norm``: the graph only has the folded weight
  W = g v / ||v||, so the pair is rebuilt as v := W, g := ||W|| (same effective weight).

Zero points are taken by the name the consuming node references: the quantizer de-duplicated
them across layers, so a layer's zero point may carry another layer's name.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

MAPPING_PATH = Path(__file__).resolve().parent / "data" / "onnx_int8_mapping.json"
ONNX_GATES_TO_TORCH = (0, 2, 3, 1)  # ONNX blocks i,o,f,c -> torch order i,f,g(c),o


def _reorder_gates(matrix: np.ndarray) -> np.ndarray:
    """Reorder the four gate blocks along axis 0 (each of height H)."""
    blocks = np.split(matrix, 4, axis=0)
    return np.concatenate([blocks[i] for i in ONNX_GATES_TO_TORCH], axis=0)


def _dequantize(values: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    return (values.astype(np.float32) - zero_point.astype(np.float32)) * scale.astype(np.float32)


def _recover(row: dict, tensors: dict[str, np.ndarray]) -> np.ndarray:
    kind = row["kind"]
    arrays = [tensors[name] for name in row["tensors"]]
    if kind in ("copy", "copy_weight_norm"):
        weight = arrays[0].astype(np.float32)
    elif kind == "transpose":
        weight = arrays[0].astype(np.float32).T
    elif kind in ("dequantize", "dequantize_weight_norm"):
        weight = _dequantize(*arrays)
    elif kind == "dequantize_columns_transpose":
        weight = _dequantize(*arrays).T  # [in, out] with per-column scale/zero point -> [out, in]
    elif kind == "lstm_weight":
        direction = row["direction"]
        values, scale, zero_point = arrays
        per_direction = _dequantize(values[direction], scale[direction], zero_point[direction])  # [in, 4H]
        weight = _reorder_gates(per_direction.T)  # [4H, in]
    elif kind == "lstm_bias":
        both = arrays[0][row["direction"]].astype(np.float32)  # [8H] = [b_ih | b_hh]
        weight = _reorder_gates(np.split(both, 2)[row["half"]])
    else:
        raise ValueError(f"mapping row {row['key']}: unknown kind {kind!r}")
    if kind.endswith("weight_norm"):
        return _weight_norm_part(row["key"], weight)
    return weight.reshape(row["shape"])


def _weight_norm_part(key: str, folded: np.ndarray) -> np.ndarray:
    """v := W and g := ||W|| over every dim but 0: one (g, v) pair with g v / ||v|| = W."""
    if key.endswith("weight_v"):
        return folded
    return np.linalg.norm(folded.reshape(folded.shape[0], -1), axis=1).reshape(-1, 1, 1).astype(np.float32)


def official_checkpoint_from_onnx(onnx_path: Path, mapping_path: Path = MAPPING_PATH) -> dict[str, dict[str, torch.Tensor]]:
    """The int8 graph's weights as the official file's five sub-dicts (``module.`` keys, g/v pairs)."""
    graph = onnx.load(str(onnx_path)).graph
    tensors = {initializer.name: numpy_helper.to_array(initializer) for initializer in graph.initializer}
    mapping = json.loads(Path(mapping_path).read_text(encoding="utf-8"))
    checkpoint: dict[str, dict[str, torch.Tensor]] = {}
    for row in mapping["rows"]:
        missing = [name for name in row["tensors"] if name not in tensors]
        if missing:
            raise ValueError(f"{onnx_path} lacks initializers {missing} for {row['key']}; "
                             f"the mapping fits sha256 {mapping['onnx_sha256'][:12]}...")
        submodule, key = row["key"].split("/", 1)
        weight = torch.from_numpy(np.ascontiguousarray(_recover(row, tensors)))
        if list(weight.shape) != list(row["shape"]):
            raise ValueError(f"{row['key']}: recovered shape {list(weight.shape)} != official {row['shape']}")
        checkpoint.setdefault(submodule, {})[key] = weight
    return checkpoint
