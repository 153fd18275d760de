r"""Kokoro's Lite decoder: the teacher's decoder with a narrower iSTFTNet generator, distilled from the
teacher generator's audio (models/training/decoder_training.py).

The generator is about nine tenths of the decoder's arithmetic: its residual blocks run at 20 and
120 positions per duration frame, 256 and 128 channels wide, while the decode blocks before it run
at the frame rate. So the student keeps the teacher's text side and decode blocks and narrows only
the generator's two stages (``stage_channels``, official (256, 128)). It starts from the teacher's
own weights: each stage keeps the channels that carry the most weight norm into and out of its
residual stream (``slice_generator``), so training starts from a voice, not from noise.

The training pairs are the generator's inputs (the decode blocks' output, the acoustic style and the
F0 curve, packed as one tensor a column per F0 value: ``pack_inputs``) with the teacher generator's
audio for the same segment. Here (the teacher's text side on the CPU, seconds a sentence):

    python -m compress.distil prepare --family kokoro --voice jf_alpha --out .device/distil

There (torch, numpy and safetensors only), in bounded chunks that resume from the checkpoint:

    python -m models.kokoro.generator_student train --dataset .device/distil/generator_inputs-*.safetensors \
        --steps 20000 --batch-size 16 --max-seconds-this-call 540 --checkpoint .device/kokoro_lite/lite_ckpt.pt \
        --device cuda --export-each-call --export-dtype float16 --export $OUT/lite_generator.safetensors

The dataset comes in shards of at most 24 MiB (a GPU call carries 64 MiB with the working tree; a
warm machine keeps what earlier calls carried, so each shard goes in its own back-to-back call),
the teacher generator (float16, 37.5 MiB) first, across the first two. Bound each call with
``--max-seconds-this-call``.

Then fine-tune on long segments. A student that has only seen 0.4 s segments (32 columns) follows
the teacher within about 1 dB on such segments, but on whole utterances it is 4-5 dB quieter than
the teacher in 1-6 kHz (scripts/kokoro_lite_length_gap.py), and that costs speaker similarity
(0.935 against our port). 500 steps more on 2.4 s segments (``--segment-frames 192 --batch-size 2
--lr 1e-4 --warmup-steps 20 --final-lr-fraction 0.3``, ``--init-weights`` the distilled student, a
new checkpoint; 40 minutes on a 2-core CPU) brought it to 0.978 (docs/benchmarks.md, "Kokoro-82M's
Lite decoder meets the CPU target").

HiFi-GAN's discriminators are there too (``--gan --mel-weight 45 --discriminator-warmup-steps
1000``, as Piper's student used), but 1,500 adversarial steps on a CPU moved neither DNSMOS nor
speaker similarity.

A student config is JSON: ``{"kind": "kokoro_generator", "stage_channels": [128, 64]}``.
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from core.atomic_io import atomic_write
from models.kokoro.config import KokoroConfig
from models.kokoro.decoder import Decoder, Generator
from models.kokoro.layers import AdaINResBlock1
from models.training.decoder_training import LatentDataset, SegmentSampler, train_decoder
from models.training.discriminators import AdversarialSettings
from models.training.losses import LossWeights

STUDENT_KIND = "kokoro_generator"
DEFAULT_STAGE_CHANNELS = (128, 64)  # 2.1x the shipped int8 graph's speed on a 2-core CPU (untrained weights)
DATASET_STEM = "generator_inputs"  # shards <stem>-000.safetensors, ... (the teacher in the first)


# ---------------------------------------------------------------- student configs


def check_student_config(config: dict) -> tuple[int, ...]:
    """``{"stage_channels": [...]}`` (``kind`` optional) -> the widths; ValueError naming what is wrong."""
    unknown = sorted(set(config) - {"kind", "stage_channels"})
    if unknown:
        raise ValueError(f"Kokoro student config: unknown keys {unknown}; accepted: ['kind', 'stage_channels']")
    if config.get("kind", STUDENT_KIND) != STUDENT_KIND:
        raise ValueError(f"Kokoro student config kind={config['kind']!r}: expected {STUDENT_KIND!r}")
    widths = tuple(config.get("stage_channels", DEFAULT_STAGE_CHANNELS))
    if not widths or any(not isinstance(width, int) or width < 1 for width in widths):
        raise ValueError(f"Kokoro student stage_channels={list(widths)}: need positive integers, one per upsampling")
    return widths


def check_fits(widths: Sequence[int], teacher: Generator) -> None:
    """ValueError unless ``widths`` has one width per stage of ``teacher``, none wider than its own."""
    if len(widths) != teacher.num_upsamples:
        raise ValueError(f"stage_channels {list(widths)}: the generator has {teacher.num_upsamples} stages")
    if any(width > own for width, own in zip(widths, teacher.stage_channels)):
        raise ValueError(f"stage_channels {list(widths)}: wider than the teacher's {list(teacher.stage_channels)}")


def student_config(generator: Generator) -> dict:
    return {"kind": STUDENT_KIND, "stage_channels": list(generator.stage_channels)}


# ---------------------------------------------------------------- starting from the teacher's weights


def _stage_modules(generator: Generator, stage: int) -> tuple[list[AdaINResBlock1], nn.Module, nn.Module]:
    """The residual blocks working on stage ``stage``'s stream, the convolution writing the source
    into it, and the one reading it out (the next upsampling, or conv_post)."""
    kernels = generator.num_kernels
    blocks = list(generator.resblocks[stage * kernels:(stage + 1) * kernels]) + [generator.noise_res[stage]]
    reader = generator.ups[stage + 1] if stage + 1 < generator.num_upsamples else generator.conv_post
    return blocks, generator.noise_convs[stage], reader


def channel_importance(generator: Generator, stage: int) -> torch.Tensor:
    """(C,) squared weight norm of everything that writes stage ``stage``'s residual stream
    (upsampling, source convolution, each block's second convolutions) or reads it (each block's
    first convolutions, the next upsampling or conv_post), per channel."""
    blocks, source_conv, reader = _stage_modules(generator, stage)
    up = generator.ups[stage]  # ConvTranspose1d weight (C_in, C_out, k)
    score = up.weight.detach().pow(2).sum(dim=(0, 2)) + source_conv.weight.detach().pow(2).sum(dim=(1, 2))
    for block in blocks:
        for conv in block.convs2:
            score += conv.weight.detach().pow(2).sum(dim=(1, 2))
        for conv in block.convs1:
            score += conv.weight.detach().pow(2).sum(dim=(0, 2))
    read_dim = (1, 2) if isinstance(reader, nn.ConvTranspose1d) else (0, 2)  # the stream is the reader's input
    return score + reader.weight.detach().pow(2).sum(dim=read_dim)


def _slice_block(block: AdaINResBlock1, keep: torch.Tensor) -> None:
    channels = block.alpha1[0].shape[1]
    halves = torch.cat([keep, keep + channels])  # AdaIN's fc: gamma rows, then beta rows
    for conv in list(block.convs1) + list(block.convs2):
        conv.weight = nn.Parameter(conv.weight.detach()[keep][:, keep].clone())
        conv.bias = nn.Parameter(conv.bias.detach()[keep].clone())
        conv.in_channels = conv.out_channels = len(keep)
    for norm in list(block.adain1) + list(block.adain2):
        norm.fc.weight = nn.Parameter(norm.fc.weight.detach()[halves].clone())
        norm.fc.bias = nn.Parameter(norm.fc.bias.detach()[halves].clone())
        norm.fc.out_features = 2 * len(keep)
    for alphas in (block.alpha1, block.alpha2):
        for index, alpha in enumerate(alphas):
            alphas[index] = nn.Parameter(alpha.detach()[:, keep].clone())


def slice_generator(teacher: Generator, stage_channels: Sequence[int]) -> Generator:
    """A narrower copy of ``teacher``: each stage keeps its ``stage_channels[i]`` most important
    channels (``channel_importance``), with the teacher's weights on them. Keeping every channel
    returns a generator that computes exactly what the teacher does."""
    widths = tuple(stage_channels)
    check_fits(widths, teacher)
    student = copy.deepcopy(teacher)
    keeps = [channel_importance(teacher, stage).topk(width).indices.sort().values
             for stage, width in enumerate(widths)]
    for stage, keep in enumerate(keeps):
        up = student.ups[stage]
        weight = up.weight.detach()[:, keep]  # (C_in, C_out, k): the stream is the output
        if stage > 0:
            weight = weight[keeps[stage - 1]]
        up.weight = nn.Parameter(weight.clone())
        up.bias = nn.Parameter(up.bias.detach()[keep].clone())
        up.in_channels, up.out_channels = weight.shape[0], weight.shape[1]
        source_conv = student.noise_convs[stage]
        source_conv.weight = nn.Parameter(source_conv.weight.detach()[keep].clone())
        source_conv.bias = nn.Parameter(source_conv.bias.detach()[keep].clone())
        source_conv.out_channels = len(keep)
        blocks, _, _ = _stage_modules(student, stage)
        for block in blocks:
            _slice_block(block, keep)
    student.conv_post.weight = nn.Parameter(student.conv_post.weight.detach()[:, keeps[-1]].clone())
    student.conv_post.in_channels = len(keeps[-1])
    student.stage_channels = widths
    return student


# ---------------------------------------------------------------- packed inputs (one tensor per utterance)


def pack_inputs(x: torch.Tensor, style: torch.Tensor, f0_curve: torch.Tensor) -> torch.Tensor:
    """Generator inputs x (B, U, 2F), acoustic style (B, S), F0 (B, 2F) -> (B, U + S + 1, 2F): the
    style repeated in every column, so any segment of columns carries all the generator needs."""
    columns = x.shape[-1]
    return torch.cat([x, style.unsqueeze(-1).expand(-1, -1, columns), f0_curve.unsqueeze(1)], dim=1)


class PackedGenerator(nn.Module):
    """A generator that takes ``pack_inputs``' tensor: (B, U + S + 1, T) -> audio (B, 1, T * scale),
    the form models/training/decoder_training.py trains (noise off: the deterministic source)."""

    def __init__(self, generator: Generator, input_channels: int):
        super().__init__()
        self.generator = generator
        self.input_channels = input_channels

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        x = packed[:, : self.input_channels]
        style = packed[:, self.input_channels:-1, 0]  # (B, S): the same in every column
        f0_curve = packed[:, -1]  # (B, T)
        return self.generator(x, style, f0_curve)


def dataset_generator_config(model_config: KokoroConfig, stage_channels: Sequence[int]) -> dict:
    """What ``build_packed_generator`` rebuilds a (teacher or student) generator from."""
    return {"kind": STUDENT_KIND, "stage_channels": list(stage_channels),
            "model_config": model_config.to_dict()}


def build_packed_generator(config: dict) -> PackedGenerator:
    """A randomly initialised generator of ``dataset_generator_config``'s shapes (load weights after)."""
    model_config = KokoroConfig.from_dict(config["model_config"])
    generator = Generator(model_config, stage_channels=tuple(config["stage_channels"]))
    return PackedGenerator(generator, model_config.istftnet.upsample_initial_channel)


# ---------------------------------------------------------------- the teacher's training pairs


@torch.no_grad()
def generator_inputs(model, phoneme_ids: Sequence[Sequence[int]], style_of, speeds: Sequence[float]) -> list[torch.Tensor]:
    """Each utterance at each speed through the teacher's text side and decode blocks (noise off)
    -> packed generator inputs (U + S + 1, 2F). ``style_of(n)``: the (1, 2S) voice row of n phonemes."""
    device = next(model.parameters()).device
    packed = []
    for ids in phoneme_ids:
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)
        ref_s = style_of(len(ids) - 2).to(device)
        acoustic_style, _ = model.split_style(ref_s)
        for speed in speeds:
            prediction = model.predict(input_ids, ref_s, speed)
            x = model.decoder.generator_input(prediction["asr"], prediction["F0_pred"], prediction["N_pred"],
                                              acoustic_style)
            packed.append(pack_inputs(x, acoustic_style, prediction["F0_pred"])[0].float().cpu())
    return packed


def teacher_dataset(voice, phoneme_ids: Sequence[Sequence[int]], speeds: Sequence[float] = (0.9, 1.0, 1.1)) -> LatentDataset:
    """The teacher voice's packed generator inputs for ``phoneme_ids`` at ``speeds``, and its generator."""
    model = voice.model
    teacher = PackedGenerator(model.decoder.generator, model.config.istftnet.upsample_initial_channel)
    return LatentDataset(generator_inputs(model, phoneme_ids, voice.style_row, speeds), teacher,
                         dataset_generator_config(model.config, model.decoder.generator.stage_channels),
                         hop_length=teacher.generator.upsample_scale, sample_rate_hz=model.config.sample_rate_hz)


# ---------------------------------------------------------------- training and loading


def train_student(dataset: LatentDataset, stage_channels: Sequence[int], checkpoint: Path, weights_path: Path,
                  card: dict, steps: int, lr: float = 5e-4, batch_size: int = 4, segment_frames: int = 32,
                  seed: int = 0, device: str = "cpu", warmup_steps: int = 50, final_lr_fraction: float = 0.1,
                  max_steps_this_call: int | None = None, log_every: int = 50, pool_segments: int = 0,
                  max_seconds_this_call: float | None = None, export_each_call: bool = False,
                  initial_weights: Path | None = None, export_dtype: torch.dtype = torch.float32,
                  loss_weights: LossWeights = LossWeights(), adversarial: AdversarialSettings | None = None) -> dict:
    """Slice the dataset's teacher generator to ``stage_channels`` and train it toward the teacher's
    audio (resumes from ``checkpoint``); when the schedule ends in this call (or no file is there
    yet, or ``export_each_call``), write the student's weights and config (with ``card`` and the
    step reached) to ``weights_path``. ``initial_weights``: a student file of the same widths to
    start from instead of the teacher's slice (a new schedule on another machine, say), read only
    when no checkpoint is there yet. ``export_dtype`` float16 halves the file (a GPU call returns
    files of at most 16 MiB; the (128, 64) student is 24.8 MB in float32); loading widens it again.
    ``loss_weights.waveform`` > 0 also asks for the teacher's phase (the slice shares its source);
    ``adversarial`` adds HiFi-GAN's discriminators (a fine-tune of a distilled student, mel weight 45)."""
    teacher = dataset.teacher_decoder
    student = PackedGenerator(slice_generator(teacher.generator, stage_channels), teacher.input_channels)
    if initial_weights is not None and not Path(checkpoint).is_file():
        _load_initial_weights(student.generator, Path(initial_weights))
    sampler = SegmentSampler(dataset, batch_size, segment_frames, seed, device, pool_segments=pool_segments,
                             log_every=log_every)
    summary = train_decoder(student, sampler, steps, lr, Path(checkpoint), device=device, log_every=log_every,
                            max_steps_this_call=max_steps_this_call, max_seconds_this_call=max_seconds_this_call,
                            warmup_steps=warmup_steps, final_lr_fraction=final_lr_fraction, loss_weights=loss_weights,
                            adversarial=adversarial)
    finished = summary["done"] and (summary["steps_this_call"] > 0 or not Path(weights_path).is_file())
    if finished or (export_each_call and summary["steps_this_call"] > 0):
        export_student(student.generator, weights_path, card | {"step_reached": summary["step"]}, export_dtype)
    return summary


def _read_student_config(path: Path) -> dict:
    """The student config a Lite generator file carries in its metadata."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if "student_config" not in metadata:
        raise ValueError(f"{path}: no student_config in its metadata; not a Kokoro Lite generator file")
    return json.loads(metadata["student_config"])


def _load_initial_weights(generator: Generator, path: Path) -> None:
    widths = check_student_config(_read_student_config(path))
    if widths != tuple(generator.stage_channels):
        raise ValueError(f"{path}: a student of stage channels {widths}, not the {tuple(generator.stage_channels)} "
                         "being trained")
    generator.load_state_dict(load_file(str(path)), strict=True)


def export_student(generator: Generator, path: Path, card: dict, dtype: torch.dtype = torch.float32) -> None:
    tensors = {k: v.detach().to(dtype).cpu().contiguous() for k, v in generator.state_dict().items()}
    metadata = {"student_config": json.dumps(student_config(generator)), "card": json.dumps(card)}
    atomic_write(Path(path), lambda tmp: save_file(tensors, tmp, metadata=metadata))


def load_student_generator(model_config: KokoroConfig, path: Path) -> tuple[Generator, dict]:
    """A student generator from its safetensors (weights only, no pickle) and its config."""
    config = _read_student_config(path)
    generator = Generator(model_config, stage_channels=check_student_config(config))
    generator.load_state_dict(load_file(str(path)), strict=True)
    return generator.eval(), config


def student_from_checkpoint(teacher: Generator, path: Path) -> tuple[Generator, int]:
    """The student generator a trainer checkpoint holds (widths read from its weights' shapes) and
    the step it reached: to score a run's checkpoints before it ends (weights only, no pickle)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    prefix = "generator."  # the trainer saves a PackedGenerator, the generator under this attribute
    weights = {name[len(prefix):]: tensor for name, tensor in state["model"].items() if name.startswith(prefix)}
    if "ups.0.weight" not in weights:
        raise ValueError(f"{path}: no packed generator weights in its 'model' entry; not a Lite trainer checkpoint")
    widths = [weights[f"ups.{i}.weight"].shape[1] for i in range(teacher.num_upsamples)]  # (in, out, kernel)
    generator = slice_generator(teacher, widths)
    generator.load_state_dict(weights, strict=True)
    return generator.eval(), int(state["step"])


def lite_decoder(teacher_decoder: Decoder, generator: Generator) -> Decoder:
    """A copy of the teacher's decoder with ``generator`` in its generator's place (the memo makes
    the copy take the student as it is, instead of copying the teacher's generator to drop it)."""
    return copy.deepcopy(teacher_decoder, memo={id(teacher_decoder.generator): generator})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train (or resume) the Lite generator on a dataset file")
    train.add_argument("--dataset", type=Path, nargs="+", required=True, help="file(s), shards of one voice")
    train.add_argument("--stage-channels", type=int, nargs="+", default=list(DEFAULT_STAGE_CHANNELS))
    train.add_argument("--steps", type=int, required=True, help="the whole schedule's steps")
    train.add_argument("--max-steps-this-call", type=int, default=None)
    train.add_argument("--max-seconds-this-call", type=float, default=None,
                       help="end this call cleanly (with a checkpoint) after the step that crosses this many seconds")
    train.add_argument("--export-each-call", action="store_true",
                       help="write the student at the end of every call, not only when the schedule ends")
    # Defaults: conf/stages/family/kokoro.yaml's recipe (from the teacher's own channels, not from scratch).
    train.add_argument("--lr", type=float, default=5e-4)
    train.add_argument("--warmup-steps", type=int, default=50)
    train.add_argument("--final-lr-fraction", type=float, default=0.1)
    train.add_argument("--batch-size", type=int, default=4)
    train.add_argument("--segment-frames", type=int, default=32,
                       help="F0 values per segment (300 samples each); fine-tune on 192 after (see above)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--pool-segments", type=int, default=0,
                       help="decode this many segments once and draw batches from them (CPU: ~2x steps/s)")
    train.add_argument("--init-weights", type=Path, default=None,
                       help="start from this student file (same widths) instead of the teacher's slice")
    train.add_argument("--stft-weight", type=float, default=1.0, help="multi-resolution STFT loss weight")
    train.add_argument("--mel-weight", type=float, default=1.0, help="log-mel L1 weight (HiFi-GAN's 45 with --gan)")
    train.add_argument("--waveform-weight", type=float, default=0.0,
                       help="weight of the relative waveform error: asks for the teacher's phase too")
    train.add_argument("--gan", action="store_true",
                       help="add HiFi-GAN's adversarial and feature-matching terms (fine-tune a distilled student)")
    train.add_argument("--discriminator-warmup-steps", type=int, default=1000,
                       help="with --gan: steps in which the discriminator learns alone")
    train.add_argument("--device", default="cpu")
    train.add_argument("--threads", type=int, default=None)
    train.add_argument("--checkpoint", type=Path, required=True)
    train.add_argument("--export", type=Path, required=True, help="the student's safetensors, written at the end")
    train.add_argument("--export-dtype", choices=("float32", "float16"), default="float32",
                       help="float16: half the file, for a GPU call's 16 MiB limit on returned files")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    check_student_config({"stage_channels": args.stage_channels})
    # Refused here, before the dataset loads.
    loss_weights = LossWeights(args.stft_weight, args.mel_weight, args.waveform_weight)
    adversarial = AdversarialSettings(discriminator_warmup_steps=args.discriminator_warmup_steps)
    adversarial = adversarial if args.gan else None
    dataset = LatentDataset.load(args.dataset, build_packed_generator)
    card = {"dataset": [str(p) for p in args.dataset], "stage_channels": args.stage_channels, "steps": args.steps,
            "lr": args.lr, "warmup_steps": args.warmup_steps, "final_lr_fraction": args.final_lr_fraction,
            "batch_size": args.batch_size, "segment_frames": args.segment_frames, "seed": args.seed,
            "pool_segments": args.pool_segments, "export_dtype": args.export_dtype,
            "stft_weight": args.stft_weight, "mel_weight": args.mel_weight, "waveform_weight": args.waveform_weight,
            "gan": args.gan, "discriminator_warmup_steps": args.discriminator_warmup_steps if args.gan else None,
            "init_weights": str(args.init_weights) if args.init_weights else None,
            "device": args.device, "trained_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    summary = train_student(dataset, args.stage_channels, args.checkpoint, args.export, card, args.steps,
                            lr=args.lr, batch_size=args.batch_size, segment_frames=args.segment_frames,
                            seed=args.seed, device=args.device, warmup_steps=args.warmup_steps,
                            final_lr_fraction=args.final_lr_fraction, max_steps_this_call=args.max_steps_this_call,
                            pool_segments=args.pool_segments, max_seconds_this_call=args.max_seconds_this_call,
                            export_each_call=args.export_each_call, initial_weights=args.init_weights,
                            export_dtype=getattr(torch, args.export_dtype),
                            loss_weights=loss_weights, adversarial=adversarial)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
