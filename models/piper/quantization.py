"""Piper's blocks for the INT8 stages: how its exported graph's node names and its PiperVits module
paths split into blocks, which parts may be quantized, and how a part is fed for calibration.

    layout = QUANTIZATION
    layout.block_of("/dec/resblocks.3/convs1.0/Conv")   # "dec.resblocks.3"
    layout.module_block("dec.resblocks.3.convs1.0")     # "dec.resblocks.3"
"""
from __future__ import annotations

import re

from torch import nn

from models.family import QuantizationLayout
from models.interface import SynthesisRequest
from models.piper.voice import PiperVoice

# Module prefix (from the exporter's node names, "/dec/resblocks.3/convs.0/Conv") -> block name.
# The first pattern that matches names the block; the group becomes "dec.resblocks.3".
BLOCK_PATTERNS = (
    re.compile(r"^/(enc_p/encoder/(?:attn_layers|ffn_layers)\.\d+)/"),  # one transformer sub-layer
    re.compile(r"^/(flow/flows\.\d+)/"),  # one affine coupling layer
    re.compile(r"^/(dec/(?:ups|resblocks)\.\d+)/"),  # one upsampling conv or multi-receptive-field block
    # The whole stochastic duration predictor is one block: its output is rounded up to frames, so
    # any of its convs can move a duration; measuring its 32 convs one by one would cost 32 runs.
    re.compile(r"^/(dp)/"),
    re.compile(r"^/([^/]+/[^/]+)/"),  # any other module two levels deep: enc_p/proj, dec/conv_pre, dec/conv_post
    re.compile(r"^/([^/]+)/"),
)
# Nodes outside any module: the two MatMuls that expand m_p/logs_p to frames.
TOP_LEVEL_BLOCK = "top_level"
# Parts that may be quantized, in the order data flows through them. The duration predictor is
# left out: its output is rounded up to whole frames, and every one of its blocks changed
# durations when quantized alone in int8_ort's measurement.
QUANTIZABLE_PARTS = ("encoder", "flow", "decoder")


def _feed_part(voice: PiperVoice, role: str, request: SynthesisRequest, part: nn.Module) -> None:
    """Encoder and flow see the request inside ``decoder_latent``; the decoder, which that stops
    before, is run on the latent the voice computed."""
    latent = voice.decoder_latent(request)  # encoder, durations, flow
    if role == "decoder":
        z = latent.z.clone()  # (B, C_lat, T_frames), a normal tensor out of inference mode
        g = None if latent.speaker_embedding is None else latent.speaker_embedding.clone()  # (B, C_g, 1)
        part(z, g)


QUANTIZATION = QuantizationLayout(
    graph_block_patterns=BLOCK_PATTERNS,
    top_level_block=TOP_LEVEL_BLOCK,
    quantizable_parts=QUANTIZABLE_PARTS,
    module_root=lambda voice: voice.model,  # PiperVits: its attribute names are the exporter's node prefixes
    feed_part=_feed_part,
    decoder_latent_channels=lambda voice: voice.model.hp.latent_channels,
)
