"""The small HiFi-GAN the tests of the shared vocoder rewrites (models/fused_hifigan.py,
models/epilogue_hifigan.py) run on. A plain module, not a conftest: tests import ``hifigan`` into
their namespace, where pytest finds the fixture (another conftest would shadow the `conftest` that
other tests import by that name)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from models.emotivoice.hifigan import HifiganGenerator
from models.emotivoice.tiny import tiny_config


def vocoder_config():
    """The tiny voice's sizes with a vocoder the Triton kernels take (channels multiples of 16):
    64 -> 32 -> 16, two kernel sizes, every dilation of the released vocoder."""
    return dataclasses.replace(tiny_config(40, 32), upsample_initial_channel=64, upsample_rates=(4, 4),
                               upsample_kernel_sizes=(8, 8), resblock_kernel_sizes=(3, 7),
                               resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)))


@pytest.fixture(scope="module")
def hifigan():
    torch.manual_seed(0)
    module = HifiganGenerator(vocoder_config()).eval()
    with torch.no_grad():
        for parameter in module.parameters():  # weights large enough that every layer matters
            parameter.normal_(0, 0.1)
    return module
