"""The HiFi-GAN fixture of the tests of the shared vocoder rewrites (tests/models/vocoder_cases.py)."""
from __future__ import annotations

import pytest
import torch

from models.emotivoice.hifigan import HifiganGenerator
from tests.models.vocoder_cases import vocoder_config


@pytest.fixture(scope="module")
def hifigan():
    torch.manual_seed(0)
    module = HifiganGenerator(vocoder_config()).eval()
    with torch.no_grad():
        for parameter in module.parameters():  # weights large enough that every layer matters
            parameter.normal_(0, 0.1)
    return module
