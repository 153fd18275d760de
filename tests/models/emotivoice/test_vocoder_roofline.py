"""scripts/emotivoice_vocoder_roofline.py: its per-convolution FLOPs agree with torch's own FLOP counter,
and its byte counts with the tensors' sizes, on a small HiFi-GAN."""
from __future__ import annotations

import dataclasses

import torch
from torch.utils.flop_counter import FlopCounterMode

from models.emotivoice.hifigan import HifiganGenerator
from models.emotivoice.symbols import synthetic_tokenlist
from models.emotivoice.tiny import tiny_config
from scripts import emotivoice_vocoder_roofline as roofline


def test_convolution_flops_and_bytes_match_torch():
    config = dataclasses.replace(tiny_config(len(synthetic_tokenlist()), 32), upsample_rates=(4, 2),
                                 upsample_kernel_sizes=(8, 4), resblock_kernel_sizes=(3, 5),
                                 resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)))
    vocoder = HifiganGenerator(config).eval()
    vocoder.remove_weight_norm()
    mel = torch.zeros(1, 80, 11)  # (1, n_mels, T)
    records = roofline.conv_records(vocoder, mel)
    # conv_pre, and per stage one transposed convolution and 2 blocks x 3 x 2 convolutions, then conv_post
    assert len(records) == 1 + 2 * (1 + 12) + 1
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        vocoder(mel)
    assert sum(record["flops"] for record in records) == counter.get_total_flops()
    first, upsample = records[0], records[1]
    assert (first["name"], first["in"], first["out"]) == ("conv_pre", [80, 11], [32, 11])
    assert first["activation_bytes"] == 2 * (80 * 11 + 32 * 11)
    assert (upsample["kind"], upsample["out"]) == ("ConvTranspose1d", [16, 44])
    assert roofline.stage_of("resblocks.3.convs1.0", 2, 2) == "stage 1"
    assert roofline.stage_of("conv_post", 2, 2) == "output (after stage 1)"
