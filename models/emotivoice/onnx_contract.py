"""EmotiVoice's ONNX graph contract: phoneme ids, speakers and the two prompt embeddings in, audio
and durations out (the acoustic model and the vocoder in one graph, masked batching).

The style encoder stays outside the graph: its embeddings are cached per prompt and per sentence
(models/emotivoice/prompts.py), so ``feeds`` computes them with the model's own cache and hands
them in. Gaussian upsampling is elementwise ops, a cumsum, a softmax and a matmul; the frame count
is an unbacked symbol, so batch, text length and frame count are all dynamic (dynamo exporter).

    contract = graph_contracts(voice)["synthesizer"]
    export_graph(contract, "emotivoice.onnx")  # export/onnx_export.py
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from models.emotivoice.generator import EmotiVoiceGenerator
from models.emotivoice.voice import EmotiVoiceVoice
from models.graph_contract import SYNTHESIZER, GraphContract
from models.interface import SynthesisRequest, VoiceCondition

OUTPUT_NAMES = ("audio", "audio_lengths", "durations")
# Batch 2 with unequal lengths: torch.export specializes a dimension whose example size is 1.
EXAMPLE_TEXT_LENGTHS = (24, 17)
INPUT_AXES = {
    "phoneme_ids": {0: "batch_size", 1: "phonemes"},
    "phoneme_lengths": {0: "batch_size"},
    "speaker_ids": {0: "batch_size"},
    "style_embedding": {0: "batch_size"},
    "content_embedding": {0: "batch_size"},
}


class SynthesizerGraph(nn.Module):
    """Tensor-only forward: (audio (B, T_audio), audio_lengths (B,), durations (B, T_text))."""

    def __init__(self, generator: EmotiVoiceGenerator):
        super().__init__()
        self.generator = generator

    def forward(self, phoneme_ids, phoneme_lengths, speaker_ids, style_embedding, content_embedding):
        out = self.generator(phoneme_ids, phoneme_lengths, speaker_ids, style_embedding, content_embedding, masked=True)
        return out["audio"], out["audio_lengths"], out["used_durations"]


def example_inputs(voice: EmotiVoiceVoice) -> dict[str, torch.Tensor]:
    config = voice.generator.config
    generator = torch.Generator().manual_seed(0)
    batch, steps = len(EXAMPLE_TEXT_LENGTHS), max(EXAMPLE_TEXT_LENGTHS)
    lengths = torch.tensor(EXAMPLE_TEXT_LENGTHS, dtype=torch.long)
    ids = torch.randint(2, config.n_vocab, (batch, steps), generator=generator) * (torch.arange(steps) < lengths[:, None])
    return {
        "phoneme_ids": ids,
        "phoneme_lengths": lengths,
        "speaker_ids": torch.arange(batch, dtype=torch.long) % config.n_speaker,
        "style_embedding": torch.tanh(torch.randn(batch, config.bert_embedding, generator=generator)),
        "content_embedding": torch.tanh(torch.randn(batch, config.bert_embedding, generator=generator)),
    }


def graph_contracts(voice: EmotiVoiceVoice) -> dict[str, GraphContract]:
    generator = voice.generator.inference_copy().cpu().float()  # plain Conv weights in the graph

    def feeds(request: SynthesisRequest) -> dict[str, np.ndarray]:
        batch = request.phoneme_ids.shape[0]
        speakers = (request.voice.speaker_id if request.voice is not None and request.voice.speaker_id is not None
                    else torch.zeros(batch, dtype=torch.long))
        return {
            "phoneme_ids": request.phoneme_ids.numpy(),
            "phoneme_lengths": request.phoneme_lengths.numpy(),
            "speaker_ids": speakers.long().reshape(-1).expand(batch).numpy(),
            "style_embedding": voice.style_embeddings(request).numpy().astype(np.float32),
            "content_embedding": voice.prompts.embed(voice.sentence_texts(request)).numpy().astype(np.float32),
        }

    return {SYNTHESIZER: GraphContract(
        module=SynthesizerGraph(generator).eval(),
        example_inputs=example_inputs(voice),
        output_names=OUTPUT_NAMES,
        input_axes=INPUT_AXES,
        output_axes={"audio": {0: "batch_size", 1: "samples"}, "audio_lengths": {0: "batch_size"},
                     "durations": {0: "batch_size", 1: "phonemes"}},
        feeds=feeds,
        audio_output="audio",
        durations_output="durations",
        example_voice=VoiceCondition(speaker_id=torch.zeros(1, dtype=torch.long)),
    )}
