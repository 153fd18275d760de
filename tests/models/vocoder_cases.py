"""The small HiFi-GAN the tests of the shared vocoder rewrites (models/fused_hifigan.py,
models/epilogue_hifigan.py) run on."""
from __future__ import annotations

import dataclasses

from models.emotivoice.tiny import tiny_config


def vocoder_config():
    """The tiny voice's sizes with a vocoder the Triton kernels take (channels multiples of 16):
    64 -> 32 -> 16, two kernel sizes, every dilation of the released vocoder."""
    return dataclasses.replace(tiny_config(40, 32), upsample_initial_channel=64, upsample_rates=(4, 4),
                               upsample_kernel_sizes=(8, 8), resblock_kernel_sizes=(3, 7),
                               resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)))
