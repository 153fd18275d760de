r"""EmotiVoice's HiFi-GAN as a student: rebuilt with its shapes (pruned or narrower), trained on the
teacher's mel frames toward the teacher vocoder's audio (models/training/decoder_training.py).

The pruning stage (compress/prune.py) and the distillation stage (compress/distil.py) reach this
through models/emotivoice/stage_hooks.py. Both students are plain convolutions: weight norm is
folded (it changes no output), so Torch-Pruning sees ordinary Conv1d weights.

Here, the teacher's mels (the acoustic model only: seconds for hundreds of sentences):

    python -m compress.distil prepare --family emotivoice --sentences 2000 --out .device/distil

There (torch, numpy and safetensors only), train in bounded chunks that resume from the checkpoint:

    python -m models.emotivoice.vocoder_student train --dataset .device/distil/mels.safetensors \
        --steps 24000 --checkpoint $OUT/lite_ckpt.pt --device cuda --export $OUT/lite_vocoder.safetensors

A student config is JSON: ``{"kind": "emotivoice_hifigan", "shapes": {...}, "channels": {...}}``;
``shapes`` are VocoderShapes fields (the module tree), ``channels`` ``[in, out]`` per convolution.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.utils import parametrize

from core.atomic_io import atomic_write
from models.emotivoice.calibration import prompt_for
from models.emotivoice.hifigan import HifiganGenerator
from models.interface import SynthesisRequest, Utterance, VoiceCondition
from models.training.convolutions import convolution_channels, resize_convolutions
from models.training.decoder_training import (
    LatentDataset,
    SegmentSampler,
    train_decoder,
)
from models.training.pruning import ROUND_CHANNELS_TO, group_importance

if TYPE_CHECKING:  # the voice pulls in transformers and the front end, which the GPU machine does not need
    from models.emotivoice.voice import EmotiVoiceVoice

STUDENT_KIND = "emotivoice_hifigan"
MEL_BATCH = 8  # sentences per acoustic-model call when collecting the teacher's mels


@dataclass(frozen=True)
class VocoderShapes:
    """The fields of GeneratorConfig that HifiganGenerator reads: its module tree and widths."""

    initial_channel: int  # mel bins in
    upsample_initial_channel: int
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, vocoder: HifiganGenerator) -> VocoderShapes:
        """Read from a built vocoder (weight-normed or plain, pruned or not)."""
        first_stage = vocoder.resblocks[: vocoder.num_kernels]
        return cls(
            initial_channel=vocoder.conv_pre.in_channels,
            upsample_initial_channel=vocoder.conv_pre.out_channels,
            upsample_rates=tuple(up.stride[0] for up in vocoder.ups),
            upsample_kernel_sizes=tuple(up.kernel_size[0] for up in vocoder.ups),
            resblock_kernel_sizes=tuple(block.convs1[0].kernel_size[0] for block in first_stage),
            resblock_dilation_sizes=tuple(tuple(conv.dilation[0] for conv in block.convs1) for block in first_stage),
        )

    @classmethod
    def from_dict(cls, values: dict) -> VocoderShapes:
        return cls(int(values["initial_channel"]), int(values["upsample_initial_channel"]),
                   tuple(values["upsample_rates"]), tuple(values["upsample_kernel_sizes"]),
                   tuple(values["resblock_kernel_sizes"]), tuple(tuple(d) for d in values["resblock_dilation_sizes"]))

    @property
    def hop_length(self) -> int:
        hop = 1
        for rate in self.upsample_rates:
            hop *= rate
        return hop


# ---------------------------------------------------------------- configs (rebuild with shapes)


def vocoder_config(vocoder: HifiganGenerator) -> dict:
    """JSON from which ``build_vocoder`` rebuilds ``vocoder`` (plain convolutions) with its shapes."""
    config = {"kind": STUDENT_KIND, "shapes": dataclasses.asdict(VocoderShapes.of(vocoder)),
              "channels": convolution_channels(vocoder)}
    return json.loads(json.dumps(config))  # lists, as read back from a file


def build_vocoder(config: dict) -> HifiganGenerator:
    """A randomly initialised plain vocoder with the shapes ``config`` describes (load weights after)."""
    if config.get("kind") != STUDENT_KIND:
        raise ValueError(f"vocoder config kind={config.get('kind')!r}: expected {STUDENT_KIND!r}")
    unknown = sorted(set(config) - {"kind", "shapes", "channels"})
    if unknown:
        raise ValueError(f"vocoder config: unknown keys {unknown}; accepted: ['channels', 'kind', 'shapes']")
    vocoder = HifiganGenerator(VocoderShapes.from_dict(config["shapes"]))
    vocoder.remove_weight_norm()
    return resize_convolutions(vocoder, config.get("channels", {}))


def plain_vocoder(vocoder: HifiganGenerator) -> HifiganGenerator:
    """A separate copy with weight norm folded (same outputs). Built afresh and loaded, never folded
    in place: a deep copy of a parametrized module shares its generated class with the original,
    and folding the copy would strip the original's weights (models/emotivoice/generator.py)."""
    device = next(vocoder.parameters()).device
    if any(parametrize.is_parametrized(module) for module in vocoder.modules()):
        fresh = HifiganGenerator(VocoderShapes.of(vocoder))
        fresh.load_state_dict(vocoder.state_dict())
        fresh.remove_weight_norm()
        return fresh.to(device).float()
    fresh = build_vocoder(vocoder_config(vocoder))
    fresh.load_state_dict(vocoder.state_dict())
    return fresh.to(device).float()


def vocoder_widths(vocoder: HifiganGenerator) -> dict[str, int]:
    """Output channels of conv_pre and of every upsampling stage: what a ratio left of each."""
    stages = {f"ups.{i}": up.out_channels for i, up in enumerate(vocoder.ups)}
    return {"conv_pre": vocoder.conv_pre.out_channels} | stages


# ---------------------------------------------------------------- the teacher's mels


def _utterances(voice: EmotiVoiceVoice, sentences: Sequence[str] | Sequence[Utterance]) -> list[Utterance]:
    return [utterance for item in sentences
            for utterance in ([item] if isinstance(item, Utterance) else voice.text_to_utterances(item))]


@torch.no_grad()
def teacher_mels(voice: EmotiVoiceVoice, sentences: Sequence[str] | Sequence[Utterance]) -> LatentDataset:
    """The acoustic model's mel frames (the vocoder's input) for every sentence, each spoken with
    its calibration prompt (models/emotivoice/calibration.py), and the teacher vocoder, folded."""
    utterances = _utterances(voice, sentences)
    if not utterances:
        raise ValueError("teacher_mels: no sentences given")
    # Rows of one call share a prompt; within a prompt, similar lengths pad little.
    utterances.sort(key=lambda u: (prompt_for(u.text), len(u.phoneme_ids)))
    mels = []
    generator = voice.generator
    device = voice.device
    start = 0
    while start < len(utterances):
        prompt = prompt_for(utterances[start].text)
        chunk = [u for u in utterances[start : start + MEL_BATCH] if prompt_for(u.text) == prompt]
        start += len(chunk)
        request = SynthesisRequest.from_utterances(chunk, voice=VoiceCondition(prompt=prompt))
        style = voice.style_embeddings(request).clone()  # (B, H): out of the cache's inference mode
        content = voice.prompts.embed([u.text for u in chunk]).clone()
        out = generator.am(request.phoneme_ids.to(device), request.phoneme_lengths.to(device),
                           torch.zeros(len(chunk), dtype=torch.long, device=device), style.to(device),
                           content.to(device), masked=True)
        for row, frames in enumerate(out["frame_lengths"].tolist()):
            mels.append(out["mel"][row, :frames].transpose(0, 1).float().cpu())  # (n_mels, T_frames)
    teacher = plain_vocoder(generator.generator).cpu().eval()
    return LatentDataset(mels, teacher, vocoder_config(teacher), voice.hop_length, voice.sample_rate_hz)


def load_mel_dataset(paths: Path | Sequence[Path]) -> LatentDataset:
    """A dataset ``teacher_mels(...).save`` wrote (one file or shards of one voice)."""
    return LatentDataset.load(paths, build_vocoder)


# ---------------------------------------------------------------- channel pruning


def prune_vocoder(vocoder: nn.Module, mel_channels: int, ratio: float, importance: str,
                  calibration: SegmentSampler | None = None) -> HifiganGenerator:
    """A plain copy of ``vocoder`` with ``ratio`` of every coupled channel group removed.

    Torch-Pruning's DependencyGraph couples each upsampling stage's ConvTranspose1d outputs with
    every resblock convolution of that stage (their outputs meet on residual sums and on the
    average over kernels) and with the next stage's inputs, so one ratio removes whole channels.
    The mel input (conv_pre's inputs) and conv_post's single waveform channel stay.
    """
    import torch_pruning as tp  # only the machine that prunes needs it

    vocoder = plain_vocoder(vocoder)
    scorer = group_importance(vocoder, importance, calibration)
    example_mel = torch.randn(1, mel_channels, 16, device=next(vocoder.parameters()).device)  # (B, n_mels, T)
    tp.pruner.BasePruner(vocoder, example_mel, importance=scorer, pruning_ratio=ratio,
                         ignored_layers=[vocoder.conv_post],  # its one output channel is the waveform
                         round_to=ROUND_CHANNELS_TO).step()
    vocoder.zero_grad(set_to_none=True)
    if vocoder.conv_pre.in_channels != mel_channels or vocoder.conv_post.out_channels != 1:
        raise RuntimeError("pruning touched the vocoder's mel input or waveform output")
    return vocoder


# ---------------------------------------------------------------- the Lite student


@dataclass(frozen=True)
class LiteVocoderConfig:
    """A narrower HiFi-GAN with the teacher's upsampling (the hop is the acoustic model's).

    128 initial channels is HiFi-GAN V2's width against V1's 512: about 1/16 of the convolution
    work. Kernels and dilations default to the teacher's."""

    upsample_initial_channel: int = 128
    resblock_kernel_sizes: tuple[int, ...] | None = None
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] | None = None

    @classmethod
    def from_dict(cls, fields: dict) -> LiteVocoderConfig:
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"Lite vocoder config: unknown fields {unknown}; accepted: {sorted(known)}")
        config = cls(**fields)
        width = config.upsample_initial_channel
        if isinstance(width, bool) or not isinstance(width, int) or width < 2:
            raise ValueError(f"Lite vocoder upsample_initial_channel={width!r}: an integer >= 2")
        kernels, dilations = config.resblock_kernel_sizes, config.resblock_dilation_sizes
        if (kernels is None) != (dilations is None) or (kernels is not None and len(kernels) != len(dilations)):
            raise ValueError(f"Lite vocoder resblock_kernel_sizes={kernels} and resblock_dilation_sizes={dilations}: "
                             "give both with one entry each per kernel, or neither (the teacher's)")
        if dilations is not None and any(len(d) != 3 for d in dilations):
            raise ValueError(f"Lite vocoder resblock_dilation_sizes={dilations}: ResBlock1 takes 3 dilations each")
        return config

    def shapes(self, teacher: VocoderShapes) -> VocoderShapes:
        if teacher.upsample_initial_channel // 2 ** len(teacher.upsample_rates) < 1 or \
                self.upsample_initial_channel // 2 ** len(teacher.upsample_rates) < 1:
            raise ValueError(f"Lite vocoder upsample_initial_channel={self.upsample_initial_channel}: halved "
                             f"{len(teacher.upsample_rates)} times it must stay >= 1")
        return dataclasses.replace(
            teacher, upsample_initial_channel=self.upsample_initial_channel,
            resblock_kernel_sizes=tuple(self.resblock_kernel_sizes or teacher.resblock_kernel_sizes),
            resblock_dilation_sizes=tuple(tuple(d) for d in (self.resblock_dilation_sizes
                                                             or teacher.resblock_dilation_sizes)))


def build_lite_vocoder(teacher_vocoder: HifiganGenerator, fields: dict) -> HifiganGenerator:
    """A randomly initialised plain Lite vocoder for ``teacher_vocoder``'s mels and hop."""
    shapes = LiteVocoderConfig.from_dict(dict(fields)).shapes(VocoderShapes.of(teacher_vocoder))
    return build_vocoder({"kind": STUDENT_KIND, "shapes": dataclasses.asdict(shapes)})


def save_student(vocoder: HifiganGenerator, weights_path: Path, card: dict) -> None:
    """Weights with their config and model card in the safetensors metadata."""
    state = {k: v.detach().float().cpu().contiguous() for k, v in vocoder.state_dict().items()}
    metadata = {"config": json.dumps(vocoder_config(vocoder)), "card": json.dumps(card, default=str)}
    atomic_write(Path(weights_path), lambda tmp: save_file(state, tmp, metadata=metadata))


def load_student(weights_path: Path) -> tuple[HifiganGenerator, dict]:
    """(the vocoder, its config) from a ``save_student`` file."""
    with safe_open(str(weights_path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if "config" not in metadata:
        raise ValueError(f"{weights_path}: no 'config' in its metadata; not a file save_student wrote")
    config = json.loads(metadata["config"])
    vocoder = build_vocoder(config)
    vocoder.load_state_dict(load_file(str(weights_path)), strict=True)
    return vocoder.eval(), config


def train_student(student: HifiganGenerator, dataset: LatentDataset, steps: int, lr: float, checkpoint_path: Path,
                  device: str, batch_size: int, segment_frames: int, seed: int, warmup_steps: int = 0,
                  final_lr_fraction: float = 1.0, max_steps_this_call: int | None = None,
                  log_every: int = 0) -> dict:
    """Teacher-forced: the student turns the teacher's mel segments into the teacher's audio."""
    sampler = SegmentSampler(dataset, batch_size, segment_frames, seed, device)
    return train_decoder(student, sampler, steps, lr, Path(checkpoint_path), device, log_every=log_every,
                         checkpoint_every=max(min(500, steps), 1), max_steps_this_call=max_steps_this_call,
                         warmup_steps=warmup_steps, final_lr_fraction=final_lr_fraction)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m models.emotivoice.vocoder_student",
                                     description="Train EmotiVoice's Lite vocoder on a teacher mel dataset.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train")
    train.add_argument("--dataset", type=Path, nargs="+", required=True, help="teacher_mels(...).save files")
    train.add_argument("--student-config", default="{}", help="LiteVocoderConfig fields as JSON")
    train.add_argument("--steps", type=int, required=True)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--warmup-steps", type=int, default=200)
    train.add_argument("--final-lr-fraction", type=float, default=0.05)
    train.add_argument("--batch-size", type=int, default=16)
    train.add_argument("--segment-frames", type=int, default=32)  # 8192 samples at hop 256
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--checkpoint", type=Path, required=True)
    train.add_argument("--max-steps-this-call", type=int)
    train.add_argument("--device", default="cpu")
    train.add_argument("--export", type=Path, required=True, help="the student's safetensors (with its config)")
    args = parser.parse_args(argv)
    dataset = load_mel_dataset(args.dataset)
    student = build_lite_vocoder(dataset.teacher_decoder, json.loads(args.student_config))
    started = time.perf_counter()
    summary = train_student(student, dataset, args.steps, args.lr, args.checkpoint, args.device, args.batch_size,
                            args.segment_frames, args.seed, args.warmup_steps, args.final_lr_fraction,
                            args.max_steps_this_call, log_every=100)
    save_student(student, args.export, {"steps": summary["step"], "dataset": [str(p) for p in args.dataset],
                                        "seconds": time.perf_counter() - started})
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
