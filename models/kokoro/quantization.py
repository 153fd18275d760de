"""Kokoro's blocks for the INT8 graph stage (compress/int8_onnxruntime.py on an exported synthesizer
graph, the ``teacher_int8`` variant): how the graph's node names split into blocks, each kept float
or quantized alone.

The exporter names Kokoro's nodes by their innermost named scopes (export/onnx_export.py), so the
synthesizer graph reads "/generator/resblocks.3/convs1.0/Conv" (decoder.generator.resblocks.3),
"/decode.2/conv1/Conv" (decoder.decode.2) and "/encoder/albert_layer_groups.0/.../MatMul" (ALBERT);
a scope path with the module root in front ("/model/decoder/generator/...") names the same block::

    QUANTIZATION.block_of("/generator/resblocks.3/convs1.0/Conv")        # "generator.resblocks.3"
    QUANTIZATION.block_of("/model/decoder/generator/ups.1/ConvTranspose")  # "generator.ups.1"

Only Conv and MatMul nodes are quantized (Int8OrtSettings.op_types): the AdaIN statistics (ReduceSum,
Sqrt, Div over time), the style Gemms, the LSTMs and the harmonic source's phase (CumSum, Sin) stay
float whatever the blocks say.

INT8 in PyTorch (int8_modelopt) is not offered: its decoder path exports a decoder of one latent
input, and Kokoro's decoder takes four (text features, F0, energy, style).
"""
from __future__ import annotations

import re

from torch import nn

from models.family import QuantizationLayout
from models.interface import SynthesisRequest
from models.kokoro.voice import KokoroVoice

_ROOT = r"^/(?:model/)?(?:decoder/|bert/|predictor/)?"  # scopes an exporter may or may not keep
BLOCK_PATTERNS = (
    # One iSTFTNet stage: an upsampling ConvTranspose, a multi-receptive-field block, the harmonic
    # source's conv into that stage and its AdaIN residual block.
    re.compile(_ROOT + r"(generator/(?:ups|resblocks|noise_convs|noise_res)\.\d+)/"),
    re.compile(_ROOT + r"(generator/(?:conv_post|m_source|stft))/"),
    re.compile(_ROOT + r"(decode\.\d+|encode)/"),  # the decoder's AdaIN residual blocks at frame rate
    # ALBERT (12 passes through one shared layer): one block, its output decides every duration.
    re.compile(_ROOT + r"(encoder)/"),
    re.compile(r"^/(?:model/)?([^/]+/[^/]+)/"),  # any other scope two levels deep: generator/Conv, ...
    re.compile(r"^/(?:model/)?([^/]+)/"),
)
# Nodes outside any named scope: the alignment MatMuls that spread text features over frames.
TOP_LEVEL_BLOCK = "top_level"
QUANTIZABLE_PARTS = ()  # no part is quantized in PyTorch (module docstring)


def _feed_part(voice: KokoroVoice, role: str, request: SynthesisRequest, part: nn.Module) -> None:
    """Synthesize ``request`` with ``part`` in place of the voice's ``role``, then put the original back."""
    original = voice.parts()[role]
    voice.replace_part(role, part)
    try:
        voice.synthesize(request)
    finally:
        voice.replace_part(role, original)


def _decoder_latent_channels(voice: KokoroVoice) -> int:
    raise ValueError(f"Kokoro's decoder ({voice.voice_name}) takes text features, F0, energy and a style, "
                     "not one latent: it is not exported alone (QUANTIZABLE_PARTS is empty)")


QUANTIZATION = QuantizationLayout(
    graph_block_patterns=BLOCK_PATTERNS,
    top_level_block=TOP_LEVEL_BLOCK,
    quantizable_parts=QUANTIZABLE_PARTS,
    module_root=lambda voice: voice.model,  # KokoroModel: the exporter's scopes are its attribute paths
    feed_part=_feed_part,
    decoder_latent_channels=_decoder_latent_channels,
)
