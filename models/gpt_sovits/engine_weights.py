"""The GPT-SoVITS v2 text-to-semantic (T2S) weights packed as plain tensors for the decoding
engines (``engine.py``, ``engine_triton.py``). The network's sizes are ``t2s.T2SConfig``; files are
read by ``t2s_checkpoint`` (no pickled code runs):

    model = load_t2s_checkpoint("s1bert25hz.ckpt").model
    weights = T2SWeights.from_state_dict(model.config, model.state_dict(), torch.float16, "cuda")

At full size with random weights, from the manifest the benchmark carries:

    model = t2s_from_manifest(MANIFEST_PATH)                     # keys and shapes checked against it
    state_dict = random_state_dict(model.config, seed=0)
    weights = T2SWeights.from_state_dict(model.config, state_dict, torch.float16, "cuda")

From a model as it runs (its dtype and device), where models/dynamic_int8.py may have converted
Linear layers; those stay int8 modules that run their own product (CPU, the torch engine only):

    weights = T2SWeights.from_model(model)
    weights.int8_projections      # e.g. ("bert_proj", "h.layers.0.linear1", ...)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from models.dynamic_int8 import DynamicInt8Linear
from models.gpt_sovits.t2s import OFFICIAL_PROJECTION_NAMES, T2SConfig, Text2SemanticModel, sinusoid_table
from models.gpt_sovits.t2s_checkpoint import KEY_PREFIX

LAYER_NORM_EPS = T2SConfig.norm_eps  # the eager port's default; the engines' kernels take it as a constant
POSITION_TABLE_LEN = 4000  # the official tables hold 4000 positions
# A projection's weight: a float tensor, or a dynamic int8 Linear (its bias inside) the torch engine calls
Projection = torch.Tensor | DynamicInt8Linear
# The model's Linear modules and the weight fields that hold them (layer fields per ``h.layers.N.``)
TOP_PROJECTIONS = {"bert_proj": "bert_proj_weight", "ar_predict_layer": "predict_weight"}
LAYER_PROJECTIONS = {"self_attn.in_proj": "qkv_weight", "self_attn.out_proj": "out_weight", "linear1": "ffn1_weight",
                     "linear2": "ffn2_weight"}
MANIFEST_PATH = Path(__file__).resolve().parent / "data" / "manifest_official_t2s.json"


def expected_shapes(config: T2SConfig) -> dict[str, tuple[int, ...]]:
    """Every key of an official T2S state dict (prefix stripped) and its shape, in the file's order:
    those of the eager port, built on the meta device (shapes only, no memory)."""
    with torch.device("meta"):
        model = Text2SemanticModel(config)
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


def random_state_dict(config: T2SConfig, seed: int, logit_std: float = 3.0) -> dict[str, torch.Tensor]:
    """Full random weights in the official layout (float32). Linear weights are drawn at unit gain;
    the output layer gives logits of about ``logit_std``, so greedy choices have margins of order one,
    as a trained model's do, instead of the near-ties of a tiny-gain head."""
    generator = torch.Generator().manual_seed(seed)
    state_dict: dict[str, torch.Tensor] = {}
    for key, shape in expected_shapes(config).items():
        if key.endswith("alpha"):
            value = torch.ones(shape) + 0.1 * torch.rand(shape, generator=generator)
        elif "norm" in key and key.endswith("weight"):
            value = torch.ones(shape) + 0.1 * torch.randn(shape, generator=generator)
        elif key.endswith("bias"):
            value = 0.02 * torch.randn(shape, generator=generator)
        elif "embedding" in key:
            value = torch.randn(shape, generator=generator)
        else:
            fan_in = shape[1]
            gain = logit_std if key == "ar_predict_layer.weight" else 1.0
            value = gain * torch.randn(shape, generator=generator) / math.sqrt(fan_in)
        state_dict[key] = value
    return state_dict


def _official_key(key: str) -> str:
    """A module's state dict key under the official checkpoint's name (``in_proj.weight`` -> ``in_proj_weight``)."""
    for ours, official in OFFICIAL_PROJECTION_NAMES.items():
        if key.endswith(ours):
            return key[: -len(ours)] + official
    return key


@dataclass
class T2SLayerWeights:
    qkv_weight: Projection  # (3d, d), rows q, k, v
    qkv_bias: torch.Tensor
    out_weight: Projection  # (d, d)
    out_bias: torch.Tensor
    ffn1_weight: Projection  # (4d, d)
    ffn1_bias: torch.Tensor
    ffn2_weight: Projection  # (d, 4d)
    ffn2_bias: torch.Tensor
    norm1_weight: torch.Tensor
    norm1_bias: torch.Tensor
    norm2_weight: torch.Tensor
    norm2_bias: torch.Tensor


@dataclass
class T2SWeights:
    """The T2S weights in one dtype on one device, with the scaled positional tables precomputed."""

    config: T2SConfig
    bert_proj_weight: Projection  # (d, bert_feature_dim)
    bert_proj_bias: torch.Tensor
    text_embedding: torch.Tensor  # (phoneme_vocab, d)
    audio_embedding: torch.Tensor  # (vocab, d)
    text_positions: torch.Tensor  # (POSITION_TABLE_LEN, d) = alpha_text * PE
    audio_positions: torch.Tensor  # (POSITION_TABLE_LEN, d) = alpha_audio * PE
    layers: list[T2SLayerWeights]
    predict_weight: Projection  # (vocab, d), no bias

    @property
    def dtype(self) -> torch.dtype:
        return self.audio_embedding.dtype

    @property
    def device(self) -> torch.device:
        return self.audio_embedding.device

    @property
    def int8_projections(self) -> tuple[str, ...]:
        """The model's Linear modules, by name, that these weights hold as DynamicInt8Linear."""
        top = [name for name, field in TOP_PROJECTIONS.items()
               if isinstance(getattr(self, field), DynamicInt8Linear)]
        in_layers = [f"h.layers.{index}.{name}" for index, layer in enumerate(self.layers)
                     for name, field in LAYER_PROJECTIONS.items()
                     if isinstance(getattr(layer, field), DynamicInt8Linear)]
        return tuple(top + in_layers)

    @classmethod
    def from_model(cls, model: Text2SemanticModel) -> T2SWeights:
        """``model``'s weights in its own dtype and device. A Linear layer that models/dynamic_int8.py
        converted is held as that module; its float equivalent passes through ``from_state_dict``'s
        checks on the way (a transient float32 copy of the int8 weights)."""
        int8 = {name: module for name, module in model.named_modules() if isinstance(module, DynamicInt8Linear)}
        state_dict = {key: value for key, value in model.state_dict().items()
                      if not any(key.startswith(name + ".") for name in int8)}
        for name, module in int8.items():
            state_dict[_official_key(f"{name}.weight")] = module.dequantized_weight()
            if module.bias is not None:
                state_dict[_official_key(f"{name}.bias")] = module.bias
        embedding = model.ar_audio_embedding.word_embeddings.weight
        weights = cls.from_state_dict(model.config, state_dict, embedding.dtype, embedding.device)
        for name, module in int8.items():
            layer, _, local = name.removeprefix("h.layers.").partition(".")
            if name in TOP_PROJECTIONS:
                setattr(weights, TOP_PROJECTIONS[name], module)
            elif name.startswith("h.layers.") and local in LAYER_PROJECTIONS:
                setattr(weights.layers[int(layer)], LAYER_PROJECTIONS[local], module)
            else:
                raise ValueError(f"T2S engine: {name!r} is dynamic int8 but is no projection the engine runs")
        return weights

    @classmethod
    def from_state_dict(
        cls, config: T2SConfig, state_dict: dict[str, torch.Tensor], dtype: torch.dtype, device: str | torch.device
    ) -> T2SWeights:
        """An official state dict (prefix stripped or not) -> weights; wrong keys or shapes are named."""
        state_dict = {key.removeprefix(KEY_PREFIX): value for key, value in state_dict.items()}
        shapes = expected_shapes(config)
        missing = sorted(shapes.keys() - state_dict.keys())
        unexpected = sorted(state_dict.keys() - shapes.keys())
        wrong = sorted(key for key in shapes.keys() & state_dict.keys() if tuple(state_dict[key].shape) != shapes[key])
        if missing or unexpected or wrong:
            raise ValueError(
                f"T2S state dict does not fit config {config}: missing {missing[:5]}, unexpected {unexpected[:5]}, "
                f"wrong shape {wrong[:5]}"
            )

        def tensor(key: str) -> torch.Tensor:
            # Upcast first: fp16 file weights become exact float32, then go to the engine's dtype.
            return state_dict[key].float().to(device=device, dtype=dtype).contiguous()

        table = sinusoid_table(POSITION_TABLE_LEN, config.hidden_dim)
        # The official code adds alpha * PE in the module's dtype; for float32 this is the same product.
        text_positions = (state_dict["ar_text_position.alpha"].float().cpu() * table).to(device=device, dtype=dtype)
        audio_positions = (state_dict["ar_audio_position.alpha"].float().cpu() * table).to(device=device, dtype=dtype)
        layers = []
        for layer in range(config.num_layers):
            prefix = f"h.layers.{layer}."
            layers.append(
                T2SLayerWeights(
                    qkv_weight=tensor(prefix + "self_attn.in_proj_weight"),
                    qkv_bias=tensor(prefix + "self_attn.in_proj_bias"),
                    out_weight=tensor(prefix + "self_attn.out_proj.weight"),
                    out_bias=tensor(prefix + "self_attn.out_proj.bias"),
                    ffn1_weight=tensor(prefix + "linear1.weight"),
                    ffn1_bias=tensor(prefix + "linear1.bias"),
                    ffn2_weight=tensor(prefix + "linear2.weight"),
                    ffn2_bias=tensor(prefix + "linear2.bias"),
                    norm1_weight=tensor(prefix + "norm1.weight"),
                    norm1_bias=tensor(prefix + "norm1.bias"),
                    norm2_weight=tensor(prefix + "norm2.weight"),
                    norm2_bias=tensor(prefix + "norm2.bias"),
                )
            )
        return cls(
            config=config,
            bert_proj_weight=tensor("bert_proj.weight"),
            bert_proj_bias=tensor("bert_proj.bias"),
            text_embedding=tensor("ar_text_embedding.word_embeddings.weight"),
            audio_embedding=tensor("ar_audio_embedding.word_embeddings.weight"),
            text_positions=text_positions,
            audio_positions=audio_positions,
            layers=layers,
            predict_weight=tensor("ar_predict_layer.weight"),
        )
