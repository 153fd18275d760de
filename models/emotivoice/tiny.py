"""EmotiVoice's architecture with tiny random weights (hop 16, hidden 32, a 2-layer BERT of width
32): the family contract test and export tests run on it in seconds. Its tokenlist is the
stand-in one (models/emotivoice/symbols.py), so real Mandarin and English text works."""
from __future__ import annotations

import math

import torch
from transformers import BertConfig

from models.emotivoice.config import GeneratorConfig
from models.emotivoice.frontend import EmotiVoiceFrontend
from models.emotivoice.generator import EmotiVoiceGenerator
from models.emotivoice.prompts import PromptEncoder, placeholder_vocab
from models.emotivoice.style_encoder import StyleEncoder
from models.emotivoice.symbols import synthetic_tokenlist
from models.emotivoice.voice import EmotiVoiceVoice

TINY_SPEAKERS = 4
TINY_BERT = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=128, type_vocab_size=2)
TINY_FRAMES_PER_PHONEME = 3  # the duration predictor's bias speaks about this many frames per phoneme


def tiny_config(n_vocab: int, bert_embedding: int) -> GeneratorConfig:
    return GeneratorConfig(
        n_vocab=n_vocab, n_speaker=TINY_SPEAKERS, n_mels=80, sample_rate_hz=16000, hop_length=16,
        encoder_n_layers=2, encoder_n_heads=2, encoder_n_hidden=32, encoder_kernel_size=3,
        decoder_n_layers=2, decoder_n_heads=2, decoder_n_hidden=32, decoder_kernel_size=3,
        variance_n_hidden=24, variance_n_layers=2, variance_kernel_size=3, variance_embed_kernel_size=9,
        duration_n_layers=2, duration_kernel_size=3, bert_embedding=bert_embedding, initial_channel=80,
        upsample_initial_channel=32, upsample_rates=(4, 4), upsample_kernel_sizes=(8, 8),
        resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3, 5),),
    )


def tiny_voice(seed: int = 0) -> EmotiVoiceVoice:
    torch.manual_seed(seed)
    tokens = synthetic_tokenlist()
    bert_config = BertConfig(**TINY_BERT)
    style_encoder = StyleEncoder(bert_config).eval()
    generator = EmotiVoiceGenerator(tiny_config(len(tokens), bert_config.hidden_size)).eval()
    with torch.no_grad():
        predictor = generator.am.duration_predictor.linear
        predictor.weight.mul_(0.1)
        predictor.bias.fill_(math.log(TINY_FRAMES_PER_PHONEME + 1))
    speakers = [str(index) for index in range(TINY_SPEAKERS)]
    prompts = PromptEncoder(style_encoder, placeholder_vocab(bert_config.vocab_size))
    return EmotiVoiceVoice(generator, prompts, EmotiVoiceFrontend(tokens, {}), speakers)
