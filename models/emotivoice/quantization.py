"""EmotiVoice's blocks for the INT8 stages: how its generator's module paths (and the exporter's
node names, which follow them) split into blocks, which parts may be quantized, and how a part is
fed for calibration.

    layout = QUANTIZATION
    layout.module_block("generator.resblocks.3.convs1.0")   # "generator.resblocks.3"
    layout.module_block("am.decoder.encoders.1.feed_forward.w_1")   # "am.decoder.encoders.1"

Calibration feeds are the calibration set's prompt/text pairs (models/emotivoice/calibration.py):
each sentence with its own emotion prompt, so the ranges cover every style the service speaks.
"""
from __future__ import annotations

import re

import torch
from torch import nn

from models.emotivoice.calibration import prompt_for
from models.emotivoice.voice import EmotiVoiceVoice
from models.family import QuantizationLayout
from models.interface import SynthesisRequest, VoiceCondition

BLOCK_PATTERNS = (
    re.compile(r"^/(generator/(?:ups|resblocks)\.\d+)/"),  # one upsampling conv or multi-receptive-field block
    re.compile(r"^/(am/(?:encoder|decoder)/encoders\.\d+)/"),  # one transformer block of the acoustic model
    # A whole variance predictor is one block: its output is rounded to frames (durations) or
    # embedded back (pitch, energy), so any of its layers can move the speech.
    re.compile(r"^/(am/(?:duration|pitch|energy)_predictor)/"),
    re.compile(r"^/([^/]+/[^/]+)/"),  # any other module two levels deep: generator/conv_pre, am/to_mel
    re.compile(r"^/([^/]+)/"),
)
TOP_LEVEL_BLOCK = "top_level"  # nodes outside any module
# In data-flow order. The style encoder is left out: its embeddings are cached per prompt and per
# sentence (models/emotivoice/prompts.py), so it costs a service almost nothing per request.
QUANTIZABLE_PARTS = ("acoustic", "vocoder")


def calibration_request(voice: EmotiVoiceVoice, request: SynthesisRequest) -> SynthesisRequest:
    """``request`` spoken with its first row's calibration prompt (rows of a request share one style)."""
    text = voice.sentence_texts(request)[0]
    return SynthesisRequest(request.phoneme_ids, request.phoneme_lengths, request.sampling,
                            VoiceCondition(prompt=prompt_for(text)))


def _feed_part(voice: EmotiVoiceVoice, role: str, request: SynthesisRequest, part: nn.Module) -> None:
    """Both parts sit in ``voice`` while they calibrate, so the whole generator runs; outside
    inference mode, so that the quantizers' statistics are ordinary tensors."""
    request = calibration_request(voice, request)
    style = voice.style_embeddings(request).clone()  # (B, H): the prompt cache hands out inference tensors
    content = voice.prompts.embed(voice.sentence_texts(request)).clone()
    batch = request.phoneme_ids.shape[0]
    with torch.no_grad():
        voice.generator(request.phoneme_ids, request.phoneme_lengths, torch.zeros(batch, dtype=torch.long),
                        style, content, masked=True)


QUANTIZATION = QuantizationLayout(
    graph_block_patterns=BLOCK_PATTERNS,
    top_level_block=TOP_LEVEL_BLOCK,
    quantizable_parts=QUANTIZABLE_PARTS,
    module_root=lambda voice: voice.generator,  # EmotiVoiceGenerator: am.*, generator.* as the checkpoint names them
    feed_part=_feed_part,
    decoder_latent_channels=lambda voice: voice.generator.config.n_mels,
    qdq_part="vocoder",  # mel frames -> audio: the Q/DQ graph a TensorRT INT8 engine is built from
)
