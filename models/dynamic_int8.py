"""Dynamic INT8 Linear layers on CPU: a model's named parts, converted in place.

Light (torch only) and below the pipeline, so that the compress stage that scores the variant
(compress/int8_dynamic.py), the server that rebuilds it from the teacher (serve/engines.py) and an
engine that reads a converted model's weights (models/gpt_sovits/engine_weights.py) run the same
product:

    from models.dynamic_int8 import to_dynamic_int8

    converted = to_dynamic_int8(voice, parts=["t2s"], keep_float=["ar_predict_layer"])  # voice changed in place
    converted["t2s"].quantized       # names of the Linear modules now DynamicInt8Linear, inside the part

Weights become int8 once, symmetric with one scale per output channel. Activations are quantized
per call from their own range, one symmetric scale per row (per token), so no calibration set is
needed and a row's output never depends on the other rows of its batch: a sentence decodes the same
alone or batched, as the float model does. torch.ao's ``quantize_dynamic`` quantizes a whole
activation tensor with one scale (a padded batch changes every row's result), is deprecated, and
its successor torchao ran a (1, 512) x (512, 1536) product eagerly at 292 us against about 45 for
this module and 72 for float32 (2 threads of this project's AMD EPYC, torch 2.13), so the product is
``torch._int_mm`` (int8 x int8 -> int32, exact) with the scales applied after.
Only ``nn.Linear`` modules are converted: a projection a part applies as a raw weight
(``F.linear(x, self.weight)``) stays float32.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch
from torch import nn

from models.interface import TTSModel

INT8_MAX = 127  # symmetric: codes -127..127, zero exactly representable
SMALLEST_PEAK = 1e-12  # an all-zero row or channel: its codes are 0, and 127 / peak must stay finite


def _symmetric_int8(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, float32 scale per row) of a 2-D float tensor, rounding to nearest: values ~ codes * scale."""
    # One multiply by 127 / peak and rounding in place: each op costs a few microseconds of dispatch,
    # which a decode step's (1, d) rows feel.
    peak = values.abs().amax(dim=1, keepdim=True).clamp_(min=SMALLEST_PEAK)  # (rows, 1)
    return (values * (INT8_MAX / peak)).round_().to(torch.int8), peak / INT8_MAX


class DynamicInt8Linear(nn.Module):
    """``nn.Linear`` with int8 weights (one scale per output channel) whose input is quantized per call,
    one scale per row. Buffers, not parameters: the layer is for inference."""

    def __init__(self, weight_int8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("weight_int8", weight_int8)  # (out, in) int8
        self.register_buffer("weight_scale", weight_scale)  # (out,) float32
        self.register_buffer("bias", bias)  # (out,) float32 or None

    @classmethod
    def from_float(cls, linear: nn.Linear) -> DynamicInt8Linear:
        weight = linear.weight.detach().float()
        codes, scale = _symmetric_int8(weight)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        return cls(codes.contiguous(), scale.squeeze(1).contiguous(), bias)

    @property
    def in_features(self) -> int:
        return self.weight_int8.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight_int8.shape[0]

    def dequantized_weight(self) -> torch.Tensor:
        """(out, in) float32: the weight this layer multiplies by, as a float tensor."""
        return self.weight_int8.float() * self.weight_scale.unsqueeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) float32 -> (..., out) float32."""
        if x.dtype != torch.float32:
            raise TypeError(f"DynamicInt8Linear takes float32 input (its scales are float32), got {x.dtype}")
        rows = x.reshape(-1, x.shape[-1])  # (R, in)
        codes, row_scale = _symmetric_int8(rows)
        # The weight's transposed view, not an (in, out) copy: the product reads (out, in) rows as
        # they lie (with the activation's quantization, 23 us against 52 us for a (1, 512) x
        # (512, 2048) product here).
        products = torch._int_mm(codes, self.weight_int8.t())  # (R, out) int32, exact
        scales = self.weight_scale * row_scale  # (R, out)
        out = products * scales if self.bias is None else torch.addcmul(self.bias, products, scales)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


@dataclass(frozen=True)
class ConvertedPart:
    quantized: tuple[str, ...]  # Linear modules now DynamicInt8Linear, by module name inside the part
    kept_float: tuple[str, ...]  # Linear modules a keep_float pattern left float32


def linear_names(part: nn.Module, keep_float: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(Linear modules to quantize, Linear modules kept float32 by a pattern), by module name."""
    quantized, kept = [], []
    for name, module in part.named_modules():
        if isinstance(module, nn.Linear):
            (kept if any(fnmatch.fnmatchcase(name, p) for p in keep_float) else quantized).append(name)
    return quantized, kept


def quantize_linears(part: nn.Module, names: list[str]) -> nn.Module:
    """``part`` with the Linear modules ``names`` replaced by DynamicInt8Linear ones, in place (the
    returned module is a new one only where ``part`` is itself the one Linear named "")."""
    for name in names:
        linear = part.get_submodule(name)
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"dynamic int8: {name!r} is a {type(linear).__name__}, not an nn.Linear")
        if not name:
            return DynamicInt8Linear.from_float(linear)
        parent_name, _, child = name.rpartition(".")
        setattr(part.get_submodule(parent_name), child, DynamicInt8Linear.from_float(linear))
    return part


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

