"""GPT-SoVITS v2's architecture with tiny random weights, for the family contract test and export
tests (seconds, not a real voice). The text front end and the 732-symbol vocabulary are the real
ones; widths the official code fixes (the synthesizer's 192 hidden channels, 512-channel speaker
embedding, 1024-wide BERT features) stay, everything configurable is shrunk."""
from __future__ import annotations

import torch
from transformers import BertConfig, HubertConfig

from models.gpt_sovits.sovits import SovitsConfig, SovitsSynthesizer
from models.gpt_sovits.ssl_encoders import random_bert, random_hubert
from models.gpt_sovits.t2s import T2SConfig, Text2SemanticModel
from models.gpt_sovits.text import VOCABULARY_SIZE
from models.gpt_sovits.voice import GptSovitsVoice
from models.gpt_sovits.voice_files import _char_tokenizer, synthetic_reference

TINY_SSL_DIM = 32
TINY_MAX_TOKENS = 120  # random weights rarely choose EOS: bound the decode


def tiny_voice(seed: int = 0) -> GptSovitsVoice:
    torch.manual_seed(seed)
    t2s = Text2SemanticModel(T2SConfig(vocab_size=1025, phoneme_vocab_size=VOCABULARY_SIZE, hidden_dim=64,
                                       num_heads=4, num_layers=2, eos_id=1024))
    sovits = SovitsSynthesizer(SovitsConfig(
        phoneme_vocab_size=VOCABULARY_SIZE, reference_bins=704, inter_channels=32, filter_channels=64,
        n_layers=2, resblock_kernel_sizes=(3, 7), resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)),
        upsample_initial_channel=64, ssl_dim=TINY_SSL_DIM, codebook_size=1024))
    with torch.no_grad():
        for name, buffer in sovits.named_buffers():
            if name.endswith("_codebook.embed"):  # an untrained codebook is all zeros: every code would be 0
                buffer.copy_(torch.randn_like(buffer))
    hubert = random_hubert(HubertConfig(hidden_size=TINY_SSL_DIM, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64, conv_dim=(32,) * 7, num_conv_pos_embeddings=16,
                                        num_conv_pos_embedding_groups=2), seed=seed)
    bert = random_bert(BertConfig(vocab_size=2000, hidden_size=1024, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=512), seed=seed)
    return GptSovitsVoice(t2s.eval(), sovits.eval(), hubert, bert, _char_tokenizer(bert.config.vocab_size),
                          synthetic_reference(sovits.config.sample_rate_hz), TINY_MAX_TOKENS)
