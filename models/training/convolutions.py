"""Rebuilding a convolutional part with changed channel counts, and saving it with its shapes.

Pruning changes channel counts but not the module tree, so a family rebuilds the tree from its
hyperparameters and a JSON config records ``[in_channels, out_channels]`` of every convolution.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn

from core.atomic_io import atomic_write


def _convolutions(module: nn.Module) -> dict[str, nn.Module]:
    return {name: layer for name, layer in module.named_modules() if isinstance(layer, (nn.Conv1d, nn.ConvTranspose1d))}


def convolution_channels(module: nn.Module) -> dict[str, list[int]]:
    """``[in_channels, out_channels]`` of every convolution, by module name."""
    return {name: [layer.in_channels, layer.out_channels] for name, layer in _convolutions(module).items()}


def _resized(layer: nn.Module, in_channels: int, out_channels: int) -> nn.Module:
    common = dict(kernel_size=layer.kernel_size, stride=layer.stride, padding=layer.padding,
                  dilation=layer.dilation, groups=layer.groups, bias=layer.bias is not None)
    if isinstance(layer, nn.ConvTranspose1d):
        return nn.ConvTranspose1d(in_channels, out_channels, output_padding=layer.output_padding, **common)
    return nn.Conv1d(in_channels, out_channels, **common)


def resize_convolutions(module: nn.Module, channels: dict[str, list[int]]) -> nn.Module:
    """Replace each named convolution of ``module`` by one with ``[in, out]`` channels, in place."""
    layers = _convolutions(module)
    for name, (in_channels, out_channels) in channels.items():
        if name not in layers:
            raise ValueError(f"config channels: no convolution {name!r}; known: {sorted(layers)}")
        parent_name, _, attribute = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attribute, _resized(layers[name], in_channels, out_channels))
    return module


def save_module(module: nn.Module, config: dict, weights_path: Path, config_path: Path) -> None:
    """Weights as safetensors and the shapes as JSON, each written beside its target then renamed."""
    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    atomic_write(weights_path, lambda tmp: save_file(state, tmp))
    text = json.dumps(config, indent=1)
    atomic_write(config_path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def load_module(weights_path: Path, config_path: Path, build: Callable[[dict], nn.Module]) -> nn.Module:
    """The module ``build`` makes from the JSON at ``config_path``, with the weights at ``weights_path``."""
    module = build(json.loads(Path(config_path).read_text(encoding="utf-8")))
    module.load_state_dict(load_file(str(weights_path)), strict=True)
    return module
