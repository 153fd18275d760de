"""GPT-SoVITS v2's HuBERT and RoBERTa front-end encoders: loading from a local folder, the official
full sizes, SSL feature layout, and the word-piece -> phoneme mapping of the BERT features.

    python -m pytest -q tests/models/gpt_sovits/test_ssl_encoders.py            # add -m slow for full size
"""
from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertTokenizer, HubertConfig

from models.gpt_sovits.ssl_encoders import (
    BERT_FEATURE_LAYER,
    bert_phone_features,
    bert_phone_features_for_text,
    load_bert,
    load_hubert,
    random_bert,
    random_hubert,
    ssl_features,
)

TINY_HUBERT = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
    "conv_dim": (16,) * 7, "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2,
}
CHARACTERS = ["你", "好", "世", "界", "。"]


@pytest.fixture(scope="module")
def tiny_bert_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_roberta")
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *CHARACTERS]) + "\n")
    BertTokenizer(str(vocab)).save_pretrained(folder)
    config = BertConfig(vocab_size=10, hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32)
    random_bert(config).save_pretrained(folder)
    return folder


def test_hubert_loads_from_a_local_folder_and_gives_50hz_features(tmp_path):
    model = random_hubert(HubertConfig(**TINY_HUBERT))
    model.save_pretrained(tmp_path)
    loaded = load_hubert(tmp_path)
    waveform = torch.randn(2, 16000)  # one second at 16 kHz
    features = ssl_features(loaded, waveform)
    assert features.shape == (2, 32, 49)  # (B, hidden, frames): 320 samples a frame, no padding
    torch.testing.assert_close(features, ssl_features(model, waveform))


def test_bert_features_repeat_hidden_layer_minus_3_per_phoneme(tiny_bert_folder):
    bert, tokenizer = load_bert(tiny_bert_folder)
    text, word2ph = "你好世界", [2, 2, 3, 1]
    features = bert_phone_features_for_text(bert, tokenizer, text, word2ph)
    assert features.shape == (16, 8)  # (hidden, phonemes)
    input_ids = tokenizer(text, return_tensors="pt")["input_ids"]
    assert input_ids.shape == (1, 6)  # [CLS] + one token per character + [SEP]
    with torch.no_grad():
        layer = bert(input_ids=input_ids, output_hidden_states=True).hidden_states[BERT_FEATURE_LAYER][0]  # (6, H)
    expected = torch.cat([layer[1].expand(2, -1), layer[2].expand(2, -1), layer[3].expand(3, -1), layer[4:5]])
    torch.testing.assert_close(features, expected.T)
    torch.testing.assert_close(bert_phone_features(bert, input_ids, word2ph), features)


def test_bert_features_refuse_mismatched_word2ph(tiny_bert_folder):
    bert, tokenizer = load_bert(tiny_bert_folder)
    with pytest.raises(ValueError, match="one per character"):
        bert_phone_features_for_text(bert, tokenizer, "你好", [2, 2, 2])
    with pytest.raises(ValueError, match="only 2 tokens"):
        bert_phone_features(bert, tokenizer("你好", return_tensors="pt")["input_ids"], [2, 2, 2])


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a chinese-hubert-base folder"):
        load_hubert(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a chinese-roberta-wwm-ext-large folder"):
        load_bert(tmp_path / "absent")


@pytest.mark.slow
def test_full_size_random_encoders_have_the_official_sizes():
    hubert = random_hubert()
    assert (hubert.config.hidden_size, hubert.config.num_hidden_layers) == (768, 12)
    assert ssl_features(hubert, torch.randn(1, 16000)).shape == (1, 768, 49)
    del hubert
    bert = random_bert()
    assert (bert.config.hidden_size, bert.config.num_hidden_layers, bert.config.vocab_size) == (1024, 24, 21128)
    input_ids = torch.tensor([[101, 872, 1962, 102]])  # [CLS] two characters [SEP]
    assert bert_phone_features(bert, input_ids, [2, 3]).shape == (1024, 5)
