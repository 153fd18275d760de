"""Dynamic INT8 Linear layers on CPU kernels: a model's named parts, converted in place.

Light (torch only) and below the pipeline, so that the compress stage that scores the variant
(compress/int8_dynamic.py) and the server that rebuilds it from the teacher (serve/engines.py)
convert a voice with the same code:

    from models.dynamic_int8 import to_dynamic_int8

    converted = to_dynamic_int8(voice, parts=["t2s"], keep_float=["ar_predict_layer"])  # voice changed in place
    converted["t2s"].quantized       # names of the Linear modules now int8, inside the part

Weights become int8 once, one scale per output channel; activations are quantized per call from
their own range, so no calibration set is needed. Only ``nn.Linear`` modules are converted: a
projection a part applies as a raw weight (``F.linear(x, self.weight)``) stays float32. torch.ao's
eager quantization is deprecated in favour of torchao, which this project does not install; its
kernels are the ones torch 2.13 ships (x86: fbgemm).
"""
from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from models.interface import TTSModel


@dataclass(frozen=True)
class ConvertedPart:
    quantized: tuple[str, ...]  # Linear modules now dynamic int8, by module name inside the part
    kept_float: tuple[str, ...]  # Linear modules a keep_float pattern left float32


def linear_names(part: nn.Module, keep_float: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(Linear modules to quantize, Linear modules kept float32 by a pattern), by module name."""
    quantized, kept = [], []
    for name, module in part.named_modules():
        if isinstance(module, nn.Linear):
            (kept if any(fnmatch.fnmatchcase(name, p) for p in keep_float) else quantized).append(name)
    return quantized, kept


def quantize_linears(part: nn.Module, names: list[str]) -> nn.Module:
    """``part`` with the Linear modules ``names`` replaced by dynamic int8 ones, in place."""
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.ao's pointer to torchao, said above
        warnings.filterwarnings("ignore", message=".*torchao.*")
        return torch.ao.quantization.quantize_dynamic(part, {name: qconfig for name in names}, dtype=torch.qint8,
                                                      inplace=True)


def to_dynamic_int8(model: TTSModel, parts: tuple[str, ...] | list[str],
                    keep_float: tuple[str, ...] | list[str] = ()) -> dict[str, ConvertedPart]:
    """Convert the Linear layers of ``model``'s part roles ``parts`` to dynamic int8, in place (copy the
    model first to keep it). ``keep_float``: fnmatch patterns on module names inside a part, left
    float32. Raises ValueError for a part the model lacks, one with no Linear layer left to convert,
    or a model that is not on the CPU (the kernels are CPU kernels)."""
    keep_float = tuple(keep_float)
    model_parts = model.parts()
    unknown = [role for role in parts if role not in model_parts]
    if unknown:
        raise ValueError(f"dynamic int8: {type(model).__name__} has no parts {unknown}; it has {list(model_parts)}")
    devices = {p.device.type for role in parts for p in model_parts[role].parameters()}
    if devices - {"cpu"}:
        raise ValueError(f"dynamic int8 runs on torch's CPU kernels; parts {list(parts)} are on {sorted(devices)}")
    converted = {}
    for role in parts:
        part = model.parts()[role]
        names, kept = linear_names(part, keep_float)
        if not names:
            raise ValueError(f"dynamic int8: part {role!r} has no Linear layer left to quantize "
                             f"(keep_float={list(keep_float)} keeps {kept})")
        model.replace_part(role, quantize_linears(part, names))
        converted[role] = ConvertedPart(tuple(names), tuple(kept))
    return converted

