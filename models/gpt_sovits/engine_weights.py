"""The GPT-SoVITS v2 text-to-semantic (T2S) weights as plain tensors, for the decoding engine.

Built straight from an official GPT checkpoint's state dict (``model.`` prefix stripped) and its
``config["model"]``, or at full size with random weights from the manifest the benchmark carries:

    config, state_dict = load_t2s_checkpoint("s1bert25hz.ckpt")      # weights_only: no pickled code runs
    weights = T2SWeights.from_state_dict(config, state_dict, torch.float16, "cuda")

    manifest = json.loads(Path(MANIFEST_PATH).read_text())
    config = T2SConfig.from_model_config(manifest["config"]["model"])
    state_dict = random_state_dict(config, seed=0)
    check_against_manifest(state_dict, manifest)                      # every key and shape, both ways

Shapes come from the checkpoint's config. The feed-forward width is always 4 x hidden_dim, as in
the official code (``linear_units`` is not read there either).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from models.gpt_sovits.t2s import sinusoid_table

STATE_DICT_PREFIX = "model."
BERT_FEATURE_DIM = 1024  # the official bert_proj reads 1024-dim RoBERTa-large features
LAYER_NORM_EPS = 1e-5  # torch's TransformerEncoderLayer default; not stored in the file
POSITION_TABLE_LEN = 4000  # the official tables hold 4000 positions
MANIFEST_PATH = Path(__file__).resolve().parent / "data" / "manifest_official_t2s.json"


@dataclass(frozen=True)
class T2SConfig:
    """Sizes of one T2S model, read from a checkpoint's ``config["model"]``."""

    vocab_size: int  # audio tokens, EOS included
    phoneme_vocab_size: int
    hidden_dim: int
    num_heads: int
    num_layers: int
    eos_id: int

    @property
    def ffn_dim(self) -> int:
        return 4 * self.hidden_dim

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.num_heads

    @classmethod
    def from_model_config(cls, model_config: dict) -> T2SConfig:
        """``config["model"]`` of an official GPT checkpoint -> sizes; a bad config names its fault."""
        required = ("vocab_size", "phoneme_vocab_size", "embedding_dim", "hidden_dim", "head", "n_layer", "EOS")
        missing = [key for key in required if key not in model_config]
        if missing:
            raise ValueError(f"T2S config['model'] lacks {missing}; an official GPT checkpoint carries {list(required)}")
        if model_config["embedding_dim"] != model_config["hidden_dim"]:
            raise ValueError(
                f"T2S embedding_dim {model_config['embedding_dim']} != hidden_dim {model_config['hidden_dim']}; "
                "the official model requires them equal"
            )
        if model_config["hidden_dim"] % model_config["head"]:
            raise ValueError(f"T2S hidden_dim {model_config['hidden_dim']} is not divisible by head {model_config['head']}")
        if model_config["EOS"] != model_config["vocab_size"] - 1:
            raise ValueError(f"T2S EOS {model_config['EOS']} must be vocab_size - 1 = {model_config['vocab_size'] - 1}")
        return cls(
            vocab_size=int(model_config["vocab_size"]),
            phoneme_vocab_size=int(model_config["phoneme_vocab_size"]),
            hidden_dim=int(model_config["hidden_dim"]),
            num_heads=int(model_config["head"]),
            num_layers=int(model_config["n_layer"]),
            eos_id=int(model_config["EOS"]),
        )


def load_t2s_checkpoint(path: str | Path) -> tuple[T2SConfig, dict[str, torch.Tensor]]:
    """An official GPT ``.ckpt`` ({"weight", "config", "info"}) -> (config, state dict without ``model.``)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or "weight" not in checkpoint or "config" not in checkpoint:
        raise ValueError(f"{path} is not an official GPT checkpoint: expected a dict with 'weight' and 'config'")
    state_dict = {key.removeprefix(STATE_DICT_PREFIX): value for key, value in checkpoint["weight"].items()}
    return T2SConfig.from_model_config(checkpoint["config"]["model"]), state_dict


def expected_shapes(config: T2SConfig) -> dict[str, tuple[int, ...]]:
    """Every key of an official T2S state dict (prefix stripped) and its shape."""
    d, ffn = config.hidden_dim, config.ffn_dim
    shapes: dict[str, tuple[int, ...]] = {
        "bert_proj.weight": (d, BERT_FEATURE_DIM),
        "bert_proj.bias": (d,),
        "ar_text_embedding.word_embeddings.weight": (config.phoneme_vocab_size, d),
        "ar_text_position.alpha": (1,),
        "ar_audio_embedding.word_embeddings.weight": (config.vocab_size, d),
        "ar_audio_position.alpha": (1,),
    }
    for layer in range(config.num_layers):
        prefix = f"h.layers.{layer}."
        shapes |= {
            prefix + "self_attn.in_proj_weight": (3 * d, d),
            prefix + "self_attn.in_proj_bias": (3 * d,),
            prefix + "self_attn.out_proj.weight": (d, d),
            prefix + "self_attn.out_proj.bias": (d,),
            prefix + "linear1.weight": (ffn, d),
            prefix + "linear1.bias": (ffn,),
            prefix + "linear2.weight": (d, ffn),
            prefix + "linear2.bias": (d,),
            prefix + "norm1.weight": (d,),
            prefix + "norm1.bias": (d,),
            prefix + "norm2.weight": (d,),
            prefix + "norm2.bias": (d,),
        }
    shapes["ar_predict_layer.weight"] = (config.vocab_size, d)
    return shapes


def check_against_manifest(state_dict: dict[str, torch.Tensor], manifest: dict) -> None:
    """Raise naming every key that is missing, unexpected or of another shape than the manifest's."""
    listed = {key.removeprefix(STATE_DICT_PREFIX): tuple(entry["shape"]) for key, entry in manifest["weight"].items()}
    ours = {key: tuple(value.shape) for key, value in state_dict.items()}
    problems = [f"missing {key}" for key in listed.keys() - ours.keys()]
    problems += [f"unexpected {key}" for key in ours.keys() - listed.keys()]
    problems += [f"{key}: {ours[key]} != {listed[key]}" for key in listed.keys() & ours.keys() if ours[key] != listed[key]]
    if problems:
        raise ValueError(f"T2S state dict disagrees with the manifest: {sorted(problems)[:10]}")


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


@dataclass
class T2SLayerWeights:
    qkv_weight: torch.Tensor  # (3d, d), rows q, k, v
    qkv_bias: torch.Tensor
    out_weight: torch.Tensor  # (d, d)
    out_bias: torch.Tensor
    ffn1_weight: torch.Tensor  # (4d, d)
    ffn1_bias: torch.Tensor
    ffn2_weight: torch.Tensor  # (d, 4d)
    ffn2_bias: torch.Tensor
    norm1_weight: torch.Tensor
    norm1_bias: torch.Tensor
    norm2_weight: torch.Tensor
    norm2_bias: torch.Tensor


@dataclass
class T2SWeights:
    """The T2S weights in one dtype on one device, with the scaled positional tables precomputed."""

    config: T2SConfig
    bert_proj_weight: torch.Tensor  # (d, 1024)
    bert_proj_bias: torch.Tensor
    text_embedding: torch.Tensor  # (phoneme_vocab, d)
    audio_embedding: torch.Tensor  # (vocab, d)
    text_positions: torch.Tensor  # (POSITION_TABLE_LEN, d) = alpha_text * PE
    audio_positions: torch.Tensor  # (POSITION_TABLE_LEN, d) = alpha_audio * PE
    layers: list[T2SLayerWeights]
    predict_weight: torch.Tensor  # (vocab, d), no bias

    @property
    def dtype(self) -> torch.dtype:
        return self.predict_weight.dtype

    @property
    def device(self) -> torch.device:
        return self.predict_weight.device

    @classmethod
    def from_state_dict(
        cls, config: T2SConfig, state_dict: dict[str, torch.Tensor], dtype: torch.dtype, device: str | torch.device
    ) -> T2SWeights:
        """An official state dict (prefix stripped or not) -> weights; wrong keys or shapes are named."""
        state_dict = {key.removeprefix(STATE_DICT_PREFIX): value for key, value in state_dict.items()}
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
        text_positions = (state_dict["ar_text_position.alpha"].float() * table).to(device=device, dtype=dtype)
        audio_positions = (state_dict["ar_audio_position.alpha"].float() * table).to(device=device, dtype=dtype)
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
