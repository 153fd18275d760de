"""Pruning a Piper voice: channel groups of its HiFi-GAN decoder, and the inner width of its text
encoder's feed-forward layers (with the encoder's own distillation fine-tune). The pruning stage
(compress/prune.py) reaches these through models/piper/training/hooks.py.

Decoder importance, on the medium voice at ratio 0.5: before any fine-tune, "taylor" left an
MR-STFT loss of 2.55 against "magnitude"'s 3.37 on calibration segments, and 0.97 against 1.52
after 300 fine-tune steps.

``encoder_ffn`` narrows the inner width (768) of the text encoder's six feed-forward layers,
which hold 5.3 M of the medium voice's 15.7 M parameters, and fine-tunes the encoder on the
teacher encoder's outputs. It changes the encoder's outputs, so durations move: at ratio 0.5
after 300 steps, 24% of phonemes on 16 calibration sentences changed by a frame or more (MCD 1.4 dB
against the teacher, 15.65 M -> 12.99 M parameters).
"""
from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import torch
from torch import nn

from models.interface import SynthesisRequest, Utterance
from models.piper.vits import TextEncoder, VitsHyperParams, hyperparams_from_dict
from models.training.convolutions import convolution_channels, resize_convolutions
from models.training.decoder_training import SegmentSampler
from models.training.pruning import (
    CALIBRATION_BATCHES,
    FINETUNE_FINAL_LR_FRACTION,
    PRUNING_SEED,
    ROUND_CHANNELS_TO,
    group_importance,
    second_order_taylor_gradients,
)
from models.training.schedule import learning_rate

ENCODER_KIND = "piper_text_encoder"


# ---------------------------------------------------------------- the HiFi-GAN decoder


def prune_decoder(decoder: nn.Module, latent_channels: int, ratio: float, importance: str,
                  calibration: SegmentSampler | None = None) -> nn.Module:
    """Remove ``ratio`` of the channels of every coupled group of ``decoder``, in place; returns it.

    Torch-Pruning's DependencyGraph groups every convolution whose channels must go together: in
    each upsampling stage the ConvTranspose1d's outputs, every resblock convolution (their outputs
    meet on residual sums) and the next stage's inputs form one group, so one ratio removes whole
    channels coherently. The latent input (conv_pre's inputs) and the single output channel of
    conv_post stay.
    """
    import torch_pruning as tp  # only the machine that prunes needs it

    scorer = group_importance(decoder, importance, calibration)
    example_latent = torch.randn(1, latent_channels, 16, device=next(decoder.parameters()).device)
    pruner = tp.pruner.BasePruner(
        decoder, example_latent, importance=scorer, pruning_ratio=ratio,
        ignored_layers=[decoder.conv_post],  # its one output channel is the waveform
        round_to=ROUND_CHANNELS_TO,
    )
    pruner.step()
    decoder.zero_grad(set_to_none=True)
    if decoder.conv_pre.in_channels != latent_channels or decoder.conv_post.out_channels != 1:
        raise RuntimeError("pruning touched the decoder's latent input or waveform output")
    return decoder


def decoder_widths(decoder: nn.Module) -> dict[str, int]:
    """Output channels of conv_pre and of every upsampling stage: what a ratio left of each."""
    return {"conv_pre": decoder.conv_pre.out_channels} | {f"ups.{i}": up.out_channels for i, up in enumerate(decoder.ups)}


# ---------------------------------------------------------------- the text encoder's feed-forward layers


def encoder_config(encoder: TextEncoder, hp: VitsHyperParams) -> dict:
    return json.loads(json.dumps({"kind": ENCODER_KIND, "hyperparams": asdict(hp),
                                  "channels": convolution_channels(encoder)}))


def build_text_encoder(config: dict) -> TextEncoder:
    """A randomly initialised text encoder with the shapes ``config`` describes (load weights after)."""
    if config.get("kind") != ENCODER_KIND:
        raise ValueError(f"encoder config kind={config.get('kind')!r}: expected {ENCODER_KIND!r}")
    return resize_convolutions(TextEncoder(hyperparams_from_dict(config["hyperparams"])), config["channels"])


def _phoneme_batch(sequences: list[Utterance], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    request = SynthesisRequest.from_utterances(sequences)
    return request.phoneme_ids.to(device), request.phoneme_lengths.to(device)


def _encoder_outputs(encoder: TextEncoder, phoneme_ids: torch.Tensor, phoneme_lengths: torch.Tensor) -> torch.Tensor:
    """Hidden states, prior mean and prior log-std stacked on channels: (B, C_hidden + 2 C_lat, T_text), masked."""
    hidden, prior_mean, prior_log_std, _ = encoder(phoneme_ids, phoneme_lengths)
    return torch.cat([hidden, prior_mean, prior_log_std], dim=1)


def encoder_distillation_mse(student: TextEncoder, teacher: TextEncoder, sequences: list[Utterance],
                             device: str) -> float:
    """Mean squared difference of the encoder outputs over ``sequences`` (padding is zero in both)."""
    phoneme_ids, phoneme_lengths = _phoneme_batch(sequences, device)
    with torch.no_grad():
        difference = _encoder_outputs(student, phoneme_ids, phoneme_lengths) - _encoder_outputs(
            teacher, phoneme_ids, phoneme_lengths)
    return difference.pow(2).mean().item()


def prune_encoder_ffn(encoder: TextEncoder, ratio: float, importance: str,
                      calibration: list[Utterance] | None = None) -> TextEncoder:
    """Remove ``ratio`` of the inner channels of every feed-forward layer of ``encoder``, in place.

    Only the inner width (conv_1's outputs, conv_2's inputs) changes: the hidden width that the
    attention, the layer norms and the duration predictor see stays.
    """
    import torch_pruning as tp  # only the machine that prunes needs it

    device = next(encoder.parameters()).device
    if importance == "magnitude":
        scorer = tp.importance.GroupMagnitudeImportance(p=2)
    else:
        if not calibration:
            raise ValueError("taylor importance needs calibration sequences")
        batches = [calibration[i : i + 8] for i in range(0, min(len(calibration), 8 * CALIBRATION_BATCHES), 8)]
        second_order_taylor_gradients(
            encoder, [lambda batch=batch: _encoder_outputs(encoder, *_phoneme_batch(batch, device)) for batch in batches])
        scorer = tp.importance.GroupTaylorImportance()
    hidden, length = encoder.hidden_channels, 16
    example = (torch.randn(1, hidden, length, device=device), torch.ones(1, 1, length, device=device))
    for ffn in encoder.encoder.ffn_layers:
        tp.pruner.BasePruner(ffn, example, importance=scorer, pruning_ratio=ratio,
                             ignored_layers=[ffn.conv_2],  # its outputs are the hidden width
                             round_to=ROUND_CHANNELS_TO).step()
    encoder.zero_grad(set_to_none=True)
    return encoder


def finetune_encoder(student: TextEncoder, teacher: TextEncoder, sequences: list[Utterance], steps: int,
                     lr: float, batch_size: int, device: str) -> dict:
    """Match the teacher encoder's outputs (MSE) on training phonemes; no checkpoint: 300 steps take
    about 8 minutes on one CPU thread (batch 8), against hours for a decoder run."""
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, betas=(0.8, 0.99))
    student.train()
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, lr, FINETUNE_FINAL_LR_FRACTION, steps // 10)
        rng = np.random.default_rng([PRUNING_SEED, step])
        batch = [sequences[i] for i in rng.choice(len(sequences), size=min(batch_size, len(sequences)), replace=False)]
        phoneme_ids, phoneme_lengths = _phoneme_batch(batch, device)
        with torch.no_grad():
            target = _encoder_outputs(teacher, phoneme_ids, phoneme_lengths)
        loss = (_encoder_outputs(student, phoneme_ids, phoneme_lengths) - target).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % max(steps // 10, 1) == 0:
            print(f"encoder step {step + 1}/{steps}  mse {loss.item():.5f}", flush=True)
    student.eval()
    return {"loss_first": losses[0], "loss_last": losses[-1]} if losses else {}
