"""GPT-SoVITS v2 text-to-semantic ("GPT") transformer: phoneme ids, BERT features and prompt
semantic tokens in, logits over the next semantic token out. Eager float32, a growing KV cache.

    from models.gpt_sovits.t2s_checkpoint import load_t2s_checkpoint
    model = load_t2s_checkpoint("s1v2.ckpt").model
    text = model.embed_text(phoneme_ids, bert_features)              # (B, T_text, D)
    logits, cache = model.prefill(text, model.embed_audio(prompt, first_position=0))
    logits, cache = model.decode_step(model.embed_audio(token, first_position=T_prompt), cache)

Parameter names are the official state dict's (``h.layers.N.self_attn.in_proj_weight``, ...), so an
official ``.ckpt`` loads 1:1 once its ``model.`` prefix is stripped (``t2s_checkpoint``). Which
token comes next and when decoding stops is ``t2s_decode``'s job.

The sequence is the text positions followed by the audio (semantic token) positions:
* text rows attend to every unpadded text column and to no audio column;
* audio rows attend to every unpadded text column and to the audio columns causally;
* layers are post-norm, ``x = LN1(x + MHA(x)); x = LN2(x + W2 relu(W1 x))``, with no final norm;
* positions are added as ``alpha * PE`` (sin at even, cos at odd channels), the input unscaled.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

# Keys of a checkpoint's ``config["model"]`` that shape the network; ``linear_units``, ``dropout``
# and ``random_bert`` are present in official files but inference never reads them.
CONFIG_KEYS = ("vocab_size", "phoneme_vocab_size", "embedding_dim", "hidden_dim", "head", "n_layer", "EOS")


@dataclass(frozen=True)
class T2SConfig:
    """Sizes of one T2S network; the eager port and the decoding engines (``engine*.py``) share it."""

    vocab_size: int  # semantic tokens plus EOS: 1025 in v2
    phoneme_vocab_size: int  # 732 in v2
    hidden_dim: int
    num_heads: int
    num_layers: int
    eos_id: int
    # The official constructor hard-codes bert_proj's input width to chinese-roberta-wwm-ext-large's
    # hidden size rather than reading it from the config.
    bert_feature_dim: int = 1024
    norm_eps: float = 1e-5  # LayerNorm default in the official layers

    def __post_init__(self):
        if self.hidden_dim % self.num_heads:
            raise ValueError(f"T2S config: hidden_dim {self.hidden_dim} is not divisible by head {self.num_heads}")
        if self.eos_id != self.vocab_size - 1:
            raise ValueError(f"T2S config: EOS {self.eos_id} must be the last token id, vocab_size - 1 = "
                             f"{self.vocab_size - 1}")

    @property
    def ffn_dim(self) -> int:
        """The official layer is always 4 x hidden_dim wide; the config's ``linear_units`` is ignored."""
        return 4 * self.hidden_dim

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.num_heads

    # The step decoder still reads these two names off the model's config.
    @property
    def heads(self) -> int:
        return self.num_heads

    @property
    def layers(self) -> int:
        return self.num_layers

    @classmethod
    def from_checkpoint_config(cls, model_config: Mapping) -> T2SConfig:
        """From a ``.ckpt`` file's ``config["model"]`` mapping."""
        missing = [key for key in CONFIG_KEYS if key not in model_config]
        if missing:
            raise ValueError(f"T2S config['model'] lacks {missing}; a GPT-SoVITS GPT config has {list(CONFIG_KEYS)}")
        if model_config["embedding_dim"] != model_config["hidden_dim"]:
            raise ValueError(f"T2S config: embedding_dim {model_config['embedding_dim']} must equal hidden_dim "
                             f"{model_config['hidden_dim']} (the embeddings feed the first layer directly)")
        return cls(vocab_size=int(model_config["vocab_size"]),
                   phoneme_vocab_size=int(model_config["phoneme_vocab_size"]),
                   hidden_dim=int(model_config["hidden_dim"]), num_heads=int(model_config["head"]),
                   num_layers=int(model_config["n_layer"]), eos_id=int(model_config["EOS"]))


def sinusoid_table(length: int, dim: int) -> torch.Tensor:
    """(length, dim) float32 on the CPU: sin at even channels, cos at odd ones, interleaved.
    Computed in float32 on the CPU like the official table, so every device adds the same values."""
    positions = torch.arange(length, dtype=torch.float32).unsqueeze(1)  # (L, 1)
    angular_rates = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * -(math.log(10000.0) / dim))  # (D/2,)
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(positions * angular_rates)
    table[:, 1::2] = torch.cos(positions * angular_rates)
    return table


@dataclass
class KVCache:
    """Per-layer keys and values of every position so far, grown by one column per decode step."""

    keys: list[torch.Tensor]  # per layer (B, H, S, D_head)
    values: list[torch.Tensor]  # per layer (B, H, S, D_head)
    # (B, S) True where a column may be attended; None when every column may (nothing padded).
    attendable: torch.Tensor | None

    @property
    def length(self) -> int:
        return self.keys[0].shape[2]

    def select_rows(self, rows: torch.Tensor) -> KVCache:
        """The cache of the batch rows ``rows`` (B',), in that order: finished rows leave the batch."""
        return KVCache([k.index_select(0, rows) for k in self.keys], [v.index_select(0, rows) for v in self.values],
                       None if self.attendable is None else self.attendable.index_select(0, rows))


class TokenEmbedding(nn.Module):
    """A wrapper only so the state dict keeps the official ``<name>.word_embeddings.weight`` key."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(ids)


class ScaledPosition(nn.Module):
    """The learned scale of the sinusoid table; the table itself is not stored in checkpoints."""

    def __init__(self):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1))


OFFICIAL_PROJECTION_NAMES = {"in_proj.weight": "in_proj_weight", "in_proj.bias": "in_proj_bias"}


def _save_official_names(module: nn.Module, state: dict, prefix: str, local_metadata) -> None:
    """Renamed in place, order kept: a checkpoint's key order is the official one. A projection a
    stage replaced (models/dynamic_int8.py) keeps its module's names: the official names are those
    of a float weight and bias."""
    if not isinstance(module.in_proj, nn.Linear):
        return
    renames = {prefix + ours: prefix + official for ours, official in OFFICIAL_PROJECTION_NAMES.items()}
    items = list(state.items())
    state.clear()
    state.update((renames.get(key, key), value) for key, value in items)


def _load_official_names(module: nn.Module, state: dict, prefix: str, *args) -> None:
    for ours, official in OFFICIAL_PROJECTION_NAMES.items():
        if prefix + official in state:
            state[prefix + ours] = state.pop(prefix + official)


class SelfAttention(nn.Module):
    """Multi-head attention with a packed q/k/v projection.

    The projection is an ``nn.Linear``, so stages that convert Linear layers (dynamic int8) reach
    it, but it is saved and loaded under ``nn.MultiheadAttention``'s names (``in_proj_weight``,
    ``in_proj_bias``), the names of the official checkpoints.
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        # skip_init: the xavier draw below is the projection's only one, so a seeded random model
        # (tiny weights, manifests) gets the same weights as when this was a bare parameter.
        self.in_proj = nn.utils.skip_init(nn.Linear, dim, 3 * dim)  # output rows: q, k, v
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.zeros_(self.in_proj.bias)
        nn.init.zeros_(self.out_proj.bias)
        self.register_state_dict_post_hook(_save_official_names)
        self.register_load_state_dict_pre_hook(_load_official_names)

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None,
                attend_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, L, D); past keys/values (B, H, S, D_head) or None; attend_mask broadcastable to
        (B, H, L, S + L), True where attention is allowed. Returns the output (B, L, D) and the keys
        and values of all S + L positions."""
        batch, length, dim = x.shape
        query, key, value = self.in_proj(x).chunk(3, dim=-1)  # 3 x (B, L, D)
        query, key, value = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)
                             for t in (query, key, value))  # (B, H, L, D_head)
        if past is not None:
            key = torch.cat([past[0], key], dim=2)  # (B, H, S + L, D_head)
            value = torch.cat([past[1], value], dim=2)
        attended = F.scaled_dot_product_attention(query, key, value, attn_mask=attend_mask)  # (B, H, L, D_head)
        attended = attended.transpose(1, 2).reshape(batch, length, dim)  # (B, L, D)
        return self.out_proj(attended), key, value


class PostNormLayer(nn.Module):
    def __init__(self, config: T2SConfig):
        super().__init__()
        self.self_attn = SelfAttention(config.hidden_dim, config.num_heads)
        self.linear1 = nn.Linear(config.hidden_dim, config.ffn_dim)
        self.linear2 = nn.Linear(config.ffn_dim, config.hidden_dim)
        self.norm1 = nn.LayerNorm(config.hidden_dim, eps=config.norm_eps)
        self.norm2 = nn.LayerNorm(config.hidden_dim, eps=config.norm_eps)

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None,
                attend_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attended, keys, values = self.self_attn(x, past, attend_mask)  # (B, L, D)
        x = self.norm1(x + attended)
        x = self.norm2(x + self.linear2(F.relu(self.linear1(x))))
        return x, keys, values


class LayerStack(nn.Module):
    """Holds ``layers`` so that keys read ``h.layers.N...`` as in official files."""

    def __init__(self, config: T2SConfig):
        super().__init__()
        self.layers = nn.ModuleList(PostNormLayer(config) for _ in range(config.num_layers))


class Text2SemanticModel(nn.Module):
    def __init__(self, config: T2SConfig):
        super().__init__()
        self.config = config
        dim = config.hidden_dim
        self.bert_proj = nn.Linear(config.bert_feature_dim, dim)
        self.ar_text_embedding = TokenEmbedding(config.phoneme_vocab_size, dim)
        self.ar_text_position = ScaledPosition()
        self.ar_audio_embedding = TokenEmbedding(config.vocab_size, dim)
        self.ar_audio_position = ScaledPosition()
        self.h = LayerStack(config)
        self.ar_predict_layer = nn.Linear(dim, config.vocab_size, bias=False)
        # Not persistent: official files do not store the table; it grows on demand.
        self.register_buffer("_position_table", torch.zeros(0, dim), persistent=False)

    @property
    def device(self) -> torch.device:
        """Where the model runs; read off an embedding, which dynamic int8 never converts."""
        return self.ar_audio_embedding.word_embeddings.weight.device

    def position_table(self, length: int) -> torch.Tensor:
        """(length, D) sinusoid rows 0..length-1 on the model's device, float32."""
        if self._position_table.shape[0] < length:
            grown = max(length, 2 * self._position_table.shape[0])
            self._position_table = sinusoid_table(grown, self.config.hidden_dim).to(self._position_table.device)
        return self._position_table[:length]

    def embed_text(self, phoneme_ids: torch.Tensor, bert_features: torch.Tensor) -> torch.Tensor:
        """phoneme_ids (B, T) int, bert_features (B, bert_feature_dim, T) -> (B, T, D), positions from 0."""
        if bert_features.shape[-1] != phoneme_ids.shape[-1] or bert_features.shape[1] != self.config.bert_feature_dim:
            raise ValueError(f"bert_features {tuple(bert_features.shape)} must be (B, {self.config.bert_feature_dim}, "
                             f"T) with T = {phoneme_ids.shape[-1]} phoneme ids")
        embedded = self.ar_text_embedding(phoneme_ids) + self.bert_proj(bert_features.transpose(1, 2))  # (B, T, D)
        table = self.position_table(phoneme_ids.shape[1]).to(embedded.dtype)  # (T, D)
        return embedded + self.ar_text_position.alpha * table

    def embed_audio(self, tokens: torch.Tensor, first_position: int) -> torch.Tensor:
        """tokens (B, T) semantic ids at audio positions first_position.. -> (B, T, D)."""
        embedded = self.ar_audio_embedding(tokens)  # (B, T, D)
        table = self.position_table(first_position + tokens.shape[1])[first_position:].to(embedded.dtype)  # (T, D)
        return embedded + self.ar_audio_position.alpha * table

    def prefill(self, text: torch.Tensor, audio: torch.Tensor | None,
                text_padding: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
        """First pass over text (B, T_text, D) and prompt audio (B, T_audio, D) or None (reference-free).

        ``text_padding`` (B, T_text), True at padded text columns, hides them from every row.
        Returns the logits at the last position (B, V) and the cache of all positions.
        """
        batch, text_length, _ = text.shape
        audio_length = 0 if audio is None else audio.shape[1]
        length = text_length + audio_length
        x = text if audio is None else torch.cat([text, audio], dim=1)  # (B, S, D)
        attend = torch.ones(length, length, dtype=torch.bool, device=x.device)  # (S, S) query x key
        attend[:text_length, text_length:] = False
        attend[text_length:, text_length:] = torch.ones(audio_length, audio_length, dtype=torch.bool,
                                                        device=x.device).tril()
        attendable = None
        if text_padding is not None and bool(text_padding.any()):
            attendable = torch.cat([~text_padding, torch.ones(batch, audio_length, dtype=torch.bool,
                                                              device=x.device)], dim=1)  # (B, S)
            attend = attend.unsqueeze(0) & attendable.unsqueeze(1)  # (B, S, S)
        attend_mask = None if bool(attend.all()) else attend.view(-1, 1, length, length)  # (B|1, 1, S, S)
        keys, values = [], []
        for layer in self.h.layers:
            x, layer_keys, layer_values = layer(x, None, attend_mask)
            keys.append(layer_keys)
            values.append(layer_values)
        return self.ar_predict_layer(x[:, -1]), KVCache(keys, values, attendable)

    def decode_step(self, audio: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, KVCache]:
        """One new audio position (B, 1, D) attending to the whole cache -> logits (B, V), the cache
        grown by that position. Only padded text columns stay hidden."""
        attendable, attend_mask = cache.attendable, None
        if attendable is not None:
            attendable = torch.cat([attendable, attendable.new_ones(attendable.shape[0], 1)], dim=1)  # (B, S + 1)
            attend_mask = attendable.view(attendable.shape[0], 1, 1, -1)  # (B, 1, 1, S + 1)
        x = audio
        keys, values = [], []
        for layer, past_keys, past_values in zip(self.h.layers, cache.keys, cache.values):
            x, layer_keys, layer_values = layer(x, (past_keys, past_values), attend_mask)
            keys.append(layer_keys)
            values.append(layer_values)
        return self.ar_predict_layer(x[:, -1]), KVCache(keys, values, attendable)
