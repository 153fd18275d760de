r"""A Piper student decoder (HiFi-GAN, possibly pruned) rebuilt with its shapes, and the teacher
latents it is trained on (models/training/decoder_training.py trains it).

Here (espeak is needed to turn text into phonemes), write training text and cache the teacher's
latents and decoder:

    python -m texts.training_text --count 400 --seed 0 --out outputs/training_text.txt
    python -m models.piper.training.decoder_student make-dataset --voice bundled:joe \
        --sentences outputs/training_text.txt --seed 0 \
        --out outputs/latents.safetensors        # about 56 MB: fits one 64 MiB GPU call; --seed 1 for a second shard

There (no espeak, no Hydra), train in bounded chunks; every call resumes from the checkpoint:

    python -m models.piper.training.decoder_student train --dataset outputs/latents.safetensors \
        --student-config outputs/student.json --steps 20000 --checkpoint outputs/ckpt.pt \
        --device cuda --max-steps-this-call 4000 --export outputs/student.safetensors

A student config is JSON: ``{"kind": "piper_hifigan", "hyperparams": {...}, "channels": {...}}``.
``hyperparams`` are VitsHyperParams fields (a Lite student changes the decoder's); ``channels``
(optional) gives ``[in, out]`` per convolution, which is how a pruned decoder is rebuilt with
its shapes (see ``decoder_config`` and ``build_decoder``).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from core.atomic_io import atomic_write
from models.interface import SynthesisRequest, Utterance
from models.piper.vits import HifiGanGenerator, VitsHyperParams, hyperparams_from_dict
from models.sampling import VitsSampling
from models.training.convolutions import convolution_channels, load_module, resize_convolutions, save_module
from models.training.decoder_training import LatentDataset, SegmentSampler, train_decoder
from models.training.losses import LossWeights

if TYPE_CHECKING:  # the voice pulls in onnx and espeak, which the GPU machine does not need
    from models.piper.voice import PiperVoice

STUDENT_KIND = "piper_hifigan"
# Distillation noise: Piper's own inference defaults, so the student learns the latents it will
# be given at synthesis time.
DISTILLATION_NOISE = VitsSampling(noise_scale=0.667, length_scale=1.0, noise_scale_w=0.8, seed=0)


# ---------------------------------------------------------------- decoder configs (rebuild with shapes)


def decoder_config(decoder: nn.Module, hp: VitsHyperParams) -> dict:
    """A JSON-able description from which ``build_decoder`` rebuilds ``decoder`` with its shapes.

    Pruning changes channel counts but not the module tree, so the tree comes from ``hp`` and
    the config records ``[in_channels, out_channels]`` of every convolution.
    """
    config = {
        "kind": STUDENT_KIND,
        "hyperparams": dataclasses.asdict(hp),
        "channels": convolution_channels(decoder),
    }
    return json.loads(json.dumps(config))  # lists, not tuples: the same in memory as read back from a file


def build_decoder(config: dict) -> HifiGanGenerator:
    """A randomly initialised decoder with the shapes ``config`` describes (load weights after)."""
    if config.get("kind") != STUDENT_KIND:
        raise ValueError(f"student config kind={config.get('kind')!r}: only {STUDENT_KIND!r} is known")
    unknown = sorted(set(config) - {"kind", "hyperparams", "channels"})
    if unknown:
        raise ValueError(f"student config: unknown keys {unknown}; accepted: ['channels', 'hyperparams', 'kind']")
    decoder = HifiGanGenerator(hyperparams_from_dict(config["hyperparams"]))
    return resize_convolutions(decoder, config.get("channels", {}))


def save_decoder(decoder: nn.Module, hp: VitsHyperParams, weights_path: Path, config_path: Path) -> None:
    save_module(decoder, decoder_config(decoder, hp), weights_path, config_path)


def load_decoder(weights_path: Path, config_path: Path) -> HifiGanGenerator:
    return load_module(weights_path, config_path, build_decoder)


def load_latent_dataset(paths: Path | Sequence[Path]) -> LatentDataset:
    """A dataset ``teacher_latents(...).save`` wrote (one file or shards of one voice)."""
    return LatentDataset.load(paths, build_decoder)


# ---------------------------------------------------------------- teacher latents and their audio


def teacher_latents(voice: PiperVoice, sentences: Sequence[str] | Sequence[Utterance],
                    noise: VitsSampling = DISTILLATION_NOISE, synthesis_batch_size: int = 8,
                    log_every: int = 0) -> LatentDataset:
    """Run the teacher up to its flow output (the decoder's input) on every sentence.

    Sentences are batched by length (less padding); batch k draws its noise from seed
    ``noise.seed + k``, so the dataset is the same on every run.
    """
    hp = voice.model.hp
    if hp.num_speakers > 1:
        raise ValueError(f"teacher_latents: voice has {hp.num_speakers} speakers; "
                         "only single-speaker voices are supported so far")
    sequences = [s for item in sentences for s in ([item] if isinstance(item, Utterance)
                                                   else voice.text_to_utterances(item))]
    if not sequences:
        raise ValueError("teacher_latents: no sentences given")
    sequences.sort(key=lambda s: len(s.phoneme_ids))
    latents = []
    for batch_index, start in enumerate(range(0, len(sequences), synthesis_batch_size)):
        chunk = sequences[start : start + synthesis_batch_size]
        request = SynthesisRequest.from_utterances(chunk, sampling=dataclasses.replace(noise, seed=noise.seed + batch_index))
        latent = voice.decoder_latent(request)
        for row, frames in enumerate(latent.frame_lengths.tolist()):
            latents.append(latent.z[row, :, :frames].float().cpu().clone())
        if log_every and (batch_index + 1) % log_every == 0:
            print(f"teacher latents: {len(latents)}/{len(sequences)} utterances", flush=True)
    decoder = voice.parts()["decoder"]
    teacher_decoder = copy.deepcopy(decoder).float().cpu().eval().requires_grad_(False)
    return LatentDataset(latents, teacher_decoder, decoder_config(decoder, hp), hp.hop_length, voice.sample_rate_hz)


def teacher_latent_batches(voice: PiperVoice, sentences: Sequence[str] | Sequence[Utterance],
                           batch_size: int, segment_frames: int, seed: int) -> SegmentSampler:
    """Endless (z (B, C_lat, segment_frames), audio (B, segment_frames * hop)) batches from the teacher.

    Iterate it, or ask for ``.batch(step)``. The teacher's text-to-latent half runs once per
    sentence, up front; its decoder runs per batch, on the segment drawn.
    """
    dataset = teacher_latents(voice, sentences, dataclasses.replace(DISTILLATION_NOISE, seed=seed))
    return SegmentSampler(dataset, batch_size, segment_frames, seed)


# ---------------------------------------------------------------- CLI


def _make_dataset(args: argparse.Namespace) -> None:
    from models.piper.voice import PiperVoice  # needs onnx and espeak: only where the dataset is made

    torch.set_num_threads(args.threads)
    voice = PiperVoice.load(args.voice)
    sentences = Path(args.sentences).read_text(encoding="utf-8").splitlines()
    dataset = teacher_latents(voice, sentences, dataclasses.replace(DISTILLATION_NOISE, seed=args.seed), log_every=10)
    dataset.save(Path(args.out), dtype=getattr(torch, args.dtype))
    seconds = dataset.total_frames * dataset.hop_length / dataset.sample_rate_hz
    print(f"wrote {args.out}: {len(dataset.latents)} utterances, {seconds:.0f} s of audio, "
          f"{Path(args.out).stat().st_size / 1e6:.1f} MB")
    if args.student_config_out:
        text = json.dumps(dataset.teacher_decoder_config, indent=1)
        atomic_write(Path(args.student_config_out), lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def _train(args: argparse.Namespace) -> None:
    torch.backends.cudnn.benchmark = True  # fixed segment shapes: let cuDNN pick its fastest kernels once
    dataset = load_latent_dataset(args.dataset)
    config = (json.loads(Path(args.student_config).read_text(encoding="utf-8")) if args.student_config
              else dataset.teacher_decoder_config)
    student = build_decoder(config)
    if args.student_init and not Path(args.checkpoint).is_file():
        student.load_state_dict(load_file(args.student_init), strict=True)
    sampler = SegmentSampler(dataset, args.batch_size, args.segment_frames, args.seed, args.device)
    summary = train_decoder(
        student, sampler, args.steps, args.lr, Path(args.checkpoint), args.device,
        LossWeights(args.stft_weight, args.mel_weight), args.log_every, args.checkpoint_every,
        args.max_steps_this_call, args.grad_clip_norm, args.final_lr_fraction, args.warmup_steps, args.bf16,
    )
    print(json.dumps(summary))
    if args.export and summary["done"]:
        state = {k: v.detach().cpu().contiguous() for k, v in student.state_dict().items()}
        atomic_write(Path(args.export), lambda tmp: save_file(state, tmp))
        print(f"wrote {args.export}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m models.piper.training.decoder_student", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    make = commands.add_parser("make-dataset", help="cache teacher latents (and the teacher decoder) for training sentences")
    make.add_argument("--voice", default="bundled:joe")
    make.add_argument("--sentences", required=True,
                      help="text file, one sentence a line (python -m texts.training_text --count 400 --out ...)")
    make.add_argument("--seed", type=int, default=0, help="noise seed")
    make.add_argument("--out", required=True)
    make.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    make.add_argument("--threads", type=int, default=1)
    make.add_argument("--student-config-out", help="also write the teacher decoder's config here")

    train = commands.add_parser("train", help="train a student decoder; resumes from --checkpoint")
    train.add_argument("--dataset", nargs="+", required=True, help="one file or several shards")
    train.add_argument("--student-config", help="JSON; default: the teacher decoder's shapes")
    train.add_argument("--student-init", help="initial weights (safetensors); ignored when resuming")
    train.add_argument("--steps", type=int, required=True, help="total steps of the run (not of this call)")
    train.add_argument("--checkpoint", required=True)
    train.add_argument("--device", default="cpu")
    train.add_argument("--max-steps-this-call", type=int)
    train.add_argument("--batch-size", type=int, default=16)
    train.add_argument("--segment-frames", type=int, default=32, help="32 frames = 8192 samples at hop 256")
    train.add_argument("--lr", type=float, default=2e-4, help="HiFi-GAN's learning rate")
    train.add_argument("--final-lr-fraction", type=float, default=1.0, help="cosine decay target; 1 = flat")
    train.add_argument("--warmup-steps", type=int, default=0)
    train.add_argument("--stft-weight", type=float, default=1.0)
    train.add_argument("--mel-weight", type=float, default=1.0)
    train.add_argument("--grad-clip-norm", type=float, default=1.0)
    train.add_argument("--log-every", type=int, default=100)
    train.add_argument("--checkpoint-every", type=int, default=500)
    train.add_argument("--seed", type=int, default=0, help="segment-sampling seed")
    train.add_argument("--bf16", action="store_true", help="student forward under bfloat16 autocast (CUDA)")
    train.add_argument("--export", help="write the student's weights here (safetensors) once all steps are done")

    args = parser.parse_args(argv)
    (_make_dataset if args.command == "make-dataset" else _train)(args)


if __name__ == "__main__":
    main()
