"""Stage: CPU INT8 by dynamic quantization of a model's Linear layers in PyTorch (the ``int8_dynamic`` variant).

The conversion is models/dynamic_int8.py's (the server rebuilds the variant with it): weights int8
with one scale per output channel, activations quantized per call with one scale per row, no
calibration set. It suits
the parts whose time goes into matrix-vector products, an autoregressive transformer's decode
steps, on CPU kernels. Which parts, and which of their Linear layers stay float32, is the family's
stage default (conf/stages/family/<family>.yaml):

    from compress.int8_dynamic import Int8DynamicSettings, build
    settings = Int8DynamicSettings(parts=["t2s"], keep_float=["ar_predict_layer"])
    int8 = build(teacher, settings, ctx)   # teacher: the fp32 Variant; ctx: compress.variants.StageContext
    int8.stage_metrics["int8_weight_fraction"]   # of the parts' weights now int8

    python -m compress model=<family>_<voice> variants=[teacher,int8_dynamic]

Only ``nn.Linear`` modules are converted: a projection a part applies as a raw weight
(``F.linear(x, self.weight)``) stays float32 and is counted in ``int8_weight_fraction``'s denominator.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from compress.variants import StageContext, Variant, check_part_roles, require_parts
from core.config import ConfigError
from models.dynamic_int8 import DynamicInt8Linear, to_dynamic_int8
from models.family import Family

VARIANT_NAME = "int8_dynamic"


@dataclass(frozen=True)
class Int8DynamicSettings:
    """``stages.int8_dynamic``: which parts' Linear layers become int8."""

    parts: tuple[str, ...]  # part roles of the family
    # fnmatch patterns on module names inside a part ("ar_predict_layer", "h.layers.0.*"), left float32.
    keep_float: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("parts", "keep_float"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigError(f"stages.int8_dynamic.{name}={value!r}: give a list, e.g. [{value}]")
            object.__setattr__(self, name, tuple(value))
        if not self.parts or len(set(self.parts)) != len(self.parts):
            raise ConfigError(f"stages.int8_dynamic.parts={list(self.parts)}: give part roles, none repeated")

    def check_family(self, family: Family) -> None:
        check_part_roles("stages.int8_dynamic.parts", self.parts, family)


def weight_bytes(module: nn.Module) -> tuple[int, int, int]:
    """(bytes, values, int8 values) of every weight and buffer ``module`` ships; an int8 weight counts
    one byte a value, its per-channel scales four. A tensor shared under several names (tied
    embeddings) counts once, as ``evaluate.memory.state_dict_size_mb`` counts it."""
    total = values = int8_values = 0
    seen = set()
    for tensor in module.state_dict().values():
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if key in seen:
            continue
        seen.add(key)
        values += tensor.numel()
        total += tensor.numel() * tensor.element_size()
        if tensor.dtype == torch.int8:
            int8_values += tensor.numel()
    return total, values, int8_values


def parameter_count_int8(model: nn.Module) -> int:
    """Parameters as the teacher counts them: a DynamicInt8Linear's weight and bias are buffers, not parameters."""
    converted = sum(m.weight_int8.numel() + (0 if m.bias is None else m.bias.numel())
                    for m in model.modules() if isinstance(m, DynamicInt8Linear))
    return sum(p.numel() for p in model.parameters()) + converted


def build(teacher: Variant, settings: Int8DynamicSettings, ctx: StageContext) -> Variant:
    """A copy of the teacher whose ``settings.parts`` run their Linear layers in dynamic int8; teacher untouched."""
    settings.check_family(ctx.family)
    require_parts("dynamic int8", teacher, ctx.family, settings.parts)
    if teacher.device != "cpu":
        raise ValueError(f"int8_dynamic runs on torch's CPU kernels; {teacher.name!r} is on {teacher.device!r}")
    model = copy.deepcopy(teacher.model)
    converted = to_dynamic_int8(model, settings.parts, settings.keep_float)
    fractions = {}
    for role in converted:
        _, values, int8_values = weight_bytes(model.parts()[role])
        fractions[f"{role}_int8_weight_fraction"] = int8_values / values
    quantized_count = sum(len(part.quantized) for part in converted.values())
    kept_all = [f"{role}.{name}" for role, part in converted.items() for name in part.kept_float]
    total_bytes, values, int8_values = weight_bytes(model)
    return Variant(
        name=VARIANT_NAME, model=model, engine="torch", device="cpu", params_m=parameter_count_int8(model) / 1e6,
        size_mb=total_bytes / 1e6,
        stage_metrics={"int8_linear_layers": float(quantized_count), "int8_weight_fraction": int8_values / values,
                       **fractions},
        stage_tags={"int8_parts": ",".join(settings.parts), "float_linear_layers": ",".join(kept_all) or "none",
                    "execution": "dynamic int8 (per-channel weights, per-row activations per call) on CPU kernels"},
    )
