"""EmotiVoice's style encoder: a BERT (SimBERT-base-Chinese layout, built by ``transformers`` from a
config, never fetched from a hub) plus the released classifier heads.

Synthesis reads only ``pooled_output`` (the BERT pooler, tanh(W h_[CLS] + b), 768-d): once for the
emotion prompt (the style embedding) and once for the text itself (the content embedding). The
heads (pitch, speed, energy, emotion, and a style projection) are kept so the released file loads
whole and the fixture checks cover them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import BertConfig, BertModel


@dataclass(frozen=True)
class StyleHeads:
    """Sizes of the classifier heads; the released ones are 3 / 3 / 3 / 7 labels and a 128-d projection."""

    pitch: int = 3  # lines of data/youdao/text/pitch
    speed: int = 3
    energy: int = 3
    emotion: int = 7  # 普通 生气 开心 惊讶 悲伤 厌恶 恐惧
    style_dim: int = 128

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor]) -> "StyleHeads":
        """Head sizes read from a (prefix-free) state dict's classifier weights."""
        def rows(name: str) -> int:
            key = f"{name}.weight"
            if key not in state:
                raise KeyError(f"style encoder weights lack {key!r}: not an EmotiVoice style encoder")
            return int(state[key].shape[0])
        return cls(pitch=rows("pitch_clf.classifier"), speed=rows("speed_clf.classifier"),
                   energy=rows("energy_clf.classifier"), emotion=rows("emotion_clf.classifier"),
                   style_dim=rows("style_embed_proj"))


class ClassificationHead(nn.Module):
    def __init__(self, hidden: int, labels: int):
        super().__init__()
        self.classifier = nn.Linear(hidden, labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled)


class StyleEncoder(nn.Module):
    def __init__(self, bert_config: BertConfig, heads: StyleHeads = StyleHeads()):
        super().__init__()
        self.bert = BertModel(bert_config, add_pooling_layer=True)
        hidden = bert_config.hidden_size
        self.pitch_clf = ClassificationHead(hidden, heads.pitch)
        self.speed_clf = ClassificationHead(hidden, heads.speed)
        self.energy_clf = ClassificationHead(hidden, heads.energy)
        self.emotion_clf = ClassificationHead(hidden, heads.emotion)
        self.style_embed_proj = nn.Linear(hidden, heads.style_dim)

    @property
    def embedding_dim(self) -> int:
        return self.bert.config.hidden_size

    def pooled(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
               attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(pooled_output (B, H), last_hidden_state (B, L, H)) for token ids (B, L)."""
        outputs = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return outputs.pooler_output, outputs.last_hidden_state

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        """The official output dict: ``pooled_output`` and the four heads' logits."""
        pooled, _ = self.pooled(input_ids, token_type_ids, attention_mask)
        return {"pooled_output": pooled, "pitch_outputs": self.pitch_clf(pooled),
                "speed_outputs": self.speed_clf(pooled), "energy_outputs": self.energy_clf(pooled),
                "emotion_outputs": self.emotion_clf(pooled)}
