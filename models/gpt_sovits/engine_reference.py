"""A straightforward T2S port for comparison with the engine: ``nn.Linear`` layers, a key/value
cache that grows by concatenation, batch 1, the official sampler written plainly.

It is the "eager FP32" column of the benchmark and the target of the CPU dynamic-INT8 row
(``torch.ao.quantization.quantize_dynamic`` replaces its Linear layers):

    model = EagerT2S.from_state_dict(config, state_dict).eval()
    result = model.decode(T2SRequest(phoneme_ids, bert_features, prompt_tokens), generator)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.gpt_sovits.engine import T2SRequest, T2SResult
from models.gpt_sovits.engine_weights import (
    BERT_FEATURE_DIM,
    LAYER_NORM_EPS,
    POSITION_TABLE_LEN,
    STATE_DICT_PREFIX,
    T2SConfig,
    expected_shapes,
)
from models.gpt_sovits.t2s import sinusoid_table


class _Layer(nn.Module):
    def __init__(self, config: T2SConfig):
        super().__init__()
        d = config.hidden_dim
        self.heads = config.num_heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ffn1 = nn.Linear(d, config.ffn_dim)
        self.ffn2 = nn.Linear(config.ffn_dim, d)
        self.norm1 = nn.LayerNorm(d, eps=LAYER_NORM_EPS)
        self.norm2 = nn.LayerNorm(d, eps=LAYER_NORM_EPS)

    def forward(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None, allowed: torch.Tensor | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        batch, length, d = x.shape  # (1, n, d)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=1)
            v = torch.cat([cache[1], v], dim=1)

        def heads(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # (1, H, n, Dh)

        attention = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=allowed)
        attention = attention.transpose(1, 2).reshape(batch, length, d)
        x = self.norm1(x + self.out(attention))
        x = self.norm2(x + self.ffn2(F.relu(self.ffn1(x))))
        return x, (k, v)


class EagerT2S(nn.Module):
    def __init__(self, config: T2SConfig):
        super().__init__()
        d = config.hidden_dim
        self.config = config
        self.bert_proj = nn.Linear(BERT_FEATURE_DIM, d)
        self.text_embedding = nn.Embedding(config.phoneme_vocab_size, d)
        self.audio_embedding = nn.Embedding(config.vocab_size, d)
        self.text_alpha = nn.Parameter(torch.ones(1))
        self.audio_alpha = nn.Parameter(torch.ones(1))
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_layers))
        self.predict = nn.Linear(d, config.vocab_size, bias=False)
        self.register_buffer("pe", sinusoid_table(POSITION_TABLE_LEN, d), persistent=False)

    @classmethod
    def from_state_dict(cls, config: T2SConfig, state_dict: dict[str, torch.Tensor]) -> EagerT2S:
        state_dict = {key.removeprefix(STATE_DICT_PREFIX): value.float() for key, value in state_dict.items()}
        missing = expected_shapes(config).keys() - state_dict.keys()
        if missing:
            raise ValueError(f"T2S state dict lacks {sorted(missing)[:5]}")
        renamed = {
            "bert_proj.weight": state_dict["bert_proj.weight"],
            "bert_proj.bias": state_dict["bert_proj.bias"],
            "text_embedding.weight": state_dict["ar_text_embedding.word_embeddings.weight"],
            "audio_embedding.weight": state_dict["ar_audio_embedding.word_embeddings.weight"],
            "text_alpha": state_dict["ar_text_position.alpha"],
            "audio_alpha": state_dict["ar_audio_position.alpha"],
            "predict.weight": state_dict["ar_predict_layer.weight"],
        }
        ours = {"self_attn.in_proj_": "qkv.", "self_attn.out_proj.": "out.", "linear1.": "ffn1.", "linear2.": "ffn2.",
                "norm1.": "norm1.", "norm2.": "norm2."}
        for layer in range(config.num_layers):
            for official, name in ours.items():
                for part in ("weight", "bias"):
                    renamed[f"layers.{layer}.{name}{part}"] = state_dict[f"h.layers.{layer}.{official}{part}"]
        model = cls(config)
        model.load_state_dict(renamed, strict=True)
        return model

    def _step(self, x: torch.Tensor, caches: list | None, allowed: torch.Tensor | None) -> tuple[torch.Tensor, list]:
        new_caches = []
        for index, layer in enumerate(self.layers):
            x, cache = layer(x, None if caches is None else caches[index], allowed)
            new_caches.append(cache)
        return self.predict(x[:, -1]), new_caches  # (1, V)

    @torch.no_grad()
    def decode(self, request: T2SRequest, generator: torch.Generator | None = None) -> T2SResult:
        """Decode one request by the official rules; the cache grows by one position per step."""
        device, dtype = self.pe.device, self.text_embedding.weight.dtype  # never quantized
        phoneme_ids = request.phoneme_ids.to(device).unsqueeze(0)  # (1, T)
        bert = request.bert_features.to(device=device, dtype=dtype).transpose(0, 1).unsqueeze(0)  # (1, T, 1024)
        text_len = phoneme_ids.shape[1]
        x = self.text_embedding(phoneme_ids) + self.bert_proj(bert)
        x = x + self.text_alpha * self.pe[:text_len]
        prompt_len = 0
        history = torch.zeros(0, dtype=torch.int64, device=device)
        if request.prompt_tokens is not None:
            history = request.prompt_tokens.to(device)
            prompt_len = history.shape[0]
            audio = self.audio_embedding(history.unsqueeze(0)) + self.audio_alpha * self.pe[:prompt_len]
            x = torch.cat([x, audio], dim=1)
        length = text_len + prompt_len
        allowed = torch.ones(length, length, dtype=torch.bool, device=device)
        allowed[:text_len, text_len:] = False
        allowed[text_len:, text_len:] = torch.ones(prompt_len, prompt_len, dtype=torch.bool, device=device).tril()
        logits, caches = self._step(x, None, allowed)
        generated = []
        stopped_by = "max_steps"
        for step in range(request.max_steps):
            token, stop_by_eos = official_sample(logits[0].float(), history, request, step, self.config.eos_id, generator)
            history = torch.cat([history, token.view(1)])
            generated.append(int(token))
            if request.early_stop_num != -1 and len(generated) > request.early_stop_num:
                stopped_by = "early_stop"
            if stop_by_eos:
                generated.pop()
                stopped_by = "eos"
            if stopped_by != "max_steps" or step == request.max_steps - 1:
                break
            x = self.audio_embedding(token.view(1, 1)) + self.audio_alpha * self.pe[prompt_len + step]
            logits, caches = self._step(x, caches, None)
        return T2SResult(
            tokens=torch.tensor(generated, dtype=torch.int64),
            stop_step=step,
            stopped_by=stopped_by,
            reference_free=request.prompt_tokens is None,
        )


def official_sample(
    logits: torch.Tensor,
    history: torch.Tensor,
    request: T2SRequest,
    step: int,
    eos_id: int,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, bool]:
    """(V,) logits -> (token, stop on EOS), in the official order with the official stop test."""
    if step < request.eos_from_step:
        logits = logits[:eos_id]  # the EOS column is dropped
    logits = logits.clone()
    if history.numel() and request.repetition_penalty != 1.0:
        score = logits[history]
        logits[history] = torch.where(score < 0, score * request.repetition_penalty, score / request.repetition_penalty)
    best = int(logits.argmax())
    if request.top_k == 1:
        token = torch.tensor(best, device=logits.device)
        return token, best == eos_id
    filtered = logits
    if request.top_p < 1.0:
        sorted_logits, sorted_ids = torch.sort(logits, descending=True)
        remove_sorted = torch.softmax(sorted_logits, dim=0).cumsum(dim=0) > request.top_p
        remove_sorted[0] = False
        remove = torch.zeros_like(remove_sorted).scatter(0, sorted_ids, remove_sorted)
        filtered = logits.masked_fill(remove, float("-inf"))
    filtered = filtered / max(request.temperature, 1e-5)
    pivot = torch.topk(filtered, min(request.top_k, filtered.shape[0])).values[-1]
    filtered = torch.where(filtered < pivot, float("-inf"), filtered)
    probabilities = torch.softmax(filtered, dim=0)
    race = torch.empty_like(probabilities).exponential_(1.0, generator=generator)
    token = (probabilities / race).argmax()
    return token, int(token) == eos_id or best == eos_id
