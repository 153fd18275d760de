"""GPT-SoVITS v2's two front-end encoders as ``transformers`` models.

* HuBERT (``chinese-hubert-base``): 16 kHz waveform -> SSL features (B, 768, frames at 50 Hz), which
  ``SovitsSynthesizer.extract_latent`` turns into the reference's semantic codes.
* RoBERTa (``chinese-roberta-wwm-ext-large``, a BERT architecture): text -> per-phoneme features
  (1024, phonemes) for the text-to-semantic model, from hidden layer -3 repeated by ``word2ph``.

From the user's folders (no download: ``local_files_only``), or at full size with random weights
when a user has none (speed and memory are then real, the features are not):

    hubert = load_hubert("pretrained_models/chinese-hubert-base")        # or random_hubert()
    bert, tokenizer = load_bert("pretrained_models/chinese-roberta-wwm-ext-large")   # or random_bert()
    ssl = ssl_features(hubert, waveform_16k)                             # (B, 768, frames)
    phone_features = bert_phone_features_for_text(bert, tokenizer, "你好", word2ph=[2, 2])  # (1024, 4)
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    HubertConfig,
    HubertModel,
)
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

SSL_SAMPLE_RATE_HZ = 16000
# The published configs' sizes; every other field is the transformers default, which they share.
CHINESE_HUBERT_BASE = {
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
    "feat_extract_norm": "group", "conv_bias": False, "do_stable_layer_norm": False,
}
CHINESE_ROBERTA_WWM_EXT_LARGE = {
    "vocab_size": 21128, "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
    "intermediate_size": 4096, "max_position_embeddings": 512, "type_vocab_size": 2,
}
BERT_FEATURE_LAYER = -3  # the official front end reads the third hidden state from the top


def _folder(path: str | Path, what: str) -> Path:
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{folder} is not a {what} folder: it needs config.json and the weights, as downloaded from the "
            "GPT-SoVITS pretrained_models")
    return folder


def load_hubert(path: str | Path) -> HubertModel:
    """``chinese-hubert-base`` from a local folder, in eval mode."""
    return HubertModel.from_pretrained(_folder(path, "chinese-hubert-base"), local_files_only=True).eval()


def random_hubert(config: HubertConfig | None = None, seed: int = 0) -> HubertModel:
    """HuBERT with random weights, at ``chinese-hubert-base`` size unless ``config`` says otherwise."""
    torch.manual_seed(seed)
    return HubertModel(config or HubertConfig(**CHINESE_HUBERT_BASE)).eval()


@torch.no_grad()
def ssl_features(hubert: HubertModel, waveform_16k: torch.Tensor) -> torch.Tensor:
    """waveform (B, n) at 16 kHz -> last hidden state (B, hidden, frames), one frame per 320 samples.

    The raw waveform goes in as the official web UI feeds it (no feature-extractor normalisation);
    the web UI first appends a short silence to the reference clip, which is the caller's choice."""
    if waveform_16k.dim() != 2:
        raise ValueError(f"waveform_16k must be (batch, samples), got shape {tuple(waveform_16k.shape)}")
    return hubert(waveform_16k).last_hidden_state.transpose(1, 2)


def load_bert(path: str | Path) -> tuple[BertForMaskedLM, PreTrainedTokenizerBase]:
    """``chinese-roberta-wwm-ext-large`` and its tokenizer from a local folder, in eval mode."""
    folder = _folder(path, "chinese-roberta-wwm-ext-large")
    model = BertForMaskedLM.from_pretrained(folder, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True)


def random_bert(config: BertConfig | None = None, seed: int = 0) -> BertForMaskedLM:
    """The BERT-feature model with random weights, at ``chinese-roberta-wwm-ext-large`` size unless
    ``config`` says otherwise."""
    torch.manual_seed(seed)
    return BertForMaskedLM(config or BertConfig(**CHINESE_ROBERTA_WWM_EXT_LARGE)).eval()


@torch.no_grad()
def bert_phone_features(bert: BertForMaskedLM, input_ids: torch.Tensor, word2ph: Sequence[int]) -> torch.Tensor:
    """input_ids (1, tokens) with [CLS] first and [SEP] last -> (hidden, sum(word2ph)).

    Token i (after [CLS]) is repeated word2ph[i] times, for the first len(word2ph) tokens: the
    official front end assumes one token per character of the (Chinese) text."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be (1, tokens), got shape {tuple(input_ids.shape)}")
    hidden = bert(input_ids=input_ids, output_hidden_states=True).hidden_states[BERT_FEATURE_LAYER]  # (1, N, H)
    per_token = hidden[0, 1:-1]  # (N - 2, H): [CLS] and [SEP] dropped
    if len(word2ph) > per_token.shape[0]:
        raise ValueError(
            f"word2ph has {len(word2ph)} entries but the text has only {per_token.shape[0]} tokens between "
            "[CLS] and [SEP]; word2ph needs one entry per token (per character for Chinese text)")
    repeats = torch.as_tensor(list(word2ph), dtype=torch.long)
    return torch.repeat_interleave(per_token[: len(word2ph)], repeats, dim=0).transpose(0, 1)  # (H, phonemes)


def bert_phone_features_for_text(
    bert: BertForMaskedLM, tokenizer: PreTrainedTokenizerBase, text: str, word2ph: Sequence[int]
) -> torch.Tensor:
    """Normalised text and its characters' phoneme counts -> (hidden, sum(word2ph)). The official v2
    front end computes these for Chinese only; other languages get zeros of the same shape."""
    if len(word2ph) != len(text):
        raise ValueError(
            f"word2ph has {len(word2ph)} entries for {len(text)} characters of {text!r}; give one per character")
    input_ids = tokenizer(text, return_tensors="pt")["input_ids"]
    return bert_phone_features(bert, input_ids, word2ph)
