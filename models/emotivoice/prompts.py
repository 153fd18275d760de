"""Text -> style-encoder embedding (the BERT pooler output), batched and cached.

EmotiVoice calls its BERT twice per sentence: on the emotion prompt (style) and on the sentence
itself (content). A service sees a handful of prompts ("开心", "悲伤", ...) across millions of
requests, so every embedding is kept in an LRU cache keyed by its text; the texts a batch still
needs go through the BERT in one padded call (BERT masks padding, so a row equals its single run).
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
from transformers import BertTokenizer

from models.emotivoice.style_encoder import StyleEncoder

# The emotions of the released style encoder (data/youdao/text/emotion), by the names a request
# may use; the prompt the encoder reads is the Chinese word.
EMOTION_PROMPTS = {
    "普通": "普通", "neutral": "普通",
    "生气": "生气", "angry": "生气",
    "开心": "开心", "happy": "开心",
    "惊讶": "惊讶", "surprised": "惊讶",
    "悲伤": "悲伤", "sad": "悲伤",
    "厌恶": "厌恶", "disgusted": "厌恶",
    "恐惧": "恐惧", "fearful": "恐惧",
}
DEFAULT_PROMPT = "普通"
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def read_bert_vocab(path: Path) -> dict[str, int]:
    """A BERT ``vocab.txt``: one word piece per line, its line number its id."""
    with open(path, encoding="utf-8") as handle:
        return {line.rstrip("\n"): index for index, line in enumerate(handle)}


def placeholder_vocab(size: int) -> dict[str, int]:
    """A character vocabulary of ``size`` entries for a BERT with random weights (no real vocab.txt
    exists for it): special tokens, the emotion prompts' characters, ASCII, then CJK in code order."""
    pieces = list(SPECIAL_TOKENS)
    candidates = [*"".join(EMOTION_PROMPTS), *(chr(c) for c in range(33, 127)), *(chr(c) for c in range(0x4E00, 0xA000))]
    for piece in dict.fromkeys(piece.lower() for piece in candidates):  # the tokenizer lower-cases
        if len(pieces) >= size:
            break
        pieces.append(piece)
    return {piece: index for index, piece in enumerate(pieces)}


class PromptEncoder:
    def __init__(self, style_encoder: StyleEncoder, vocab: dict[str, int], max_cached: int = 4096):
        self.model = style_encoder
        self.tokenizer = BertTokenizer(vocab=vocab)
        self.max_length = style_encoder.bert.config.max_position_embeddings
        self.max_cached = max_cached
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.calls = 0  # BERT forward passes so far (tests and benchmarks read it)

    def clear(self) -> None:
        """Forget every embedding (after the style encoder changed)."""
        self._cache.clear()

    @torch.inference_mode()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """(N, H) float32 on the CPU, one row per text; texts not cached run in one batch."""
        missing = list(dict.fromkeys(text for text in texts if text not in self._cache))
        if missing:
            device = next(self.model.parameters()).device
            tokens = self.tokenizer(missing, padding=True, truncation=True, max_length=self.max_length,
                                    return_tensors="pt")
            pooled, _ = self.model.pooled(tokens["input_ids"].to(device), tokens["token_type_ids"].to(device),
                                          tokens["attention_mask"].to(device))
            self.calls += 1
            for text, row in zip(missing, pooled.float().cpu()):
                self._cache[text] = row
        rows = []
        for text in texts:
            self._cache.move_to_end(text)
            rows.append(self._cache[text])
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return torch.stack(rows)
