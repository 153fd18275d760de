r"""Teacher-forced decoder training: a student decoder learns to turn the teacher's latents into
the teacher's audio. Torch, numpy and safetensors only, so it runs on the GPU machine as it is.

Here (espeak is needed to turn text into phonemes), cache the teacher's latents and decoder:

    python -m compress.decoder_training make-dataset --voice bundled:joe --count 400 --seed 0 \
        --out outputs/latents.safetensors        # about 56 MB: fits one 64 MiB GPU call; --seed 1 for a second shard

There (no espeak, no Hydra), train in bounded chunks; every call resumes from the checkpoint:

    python -m compress.decoder_training train --dataset outputs/latents.safetensors \
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
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from core.atomic_io import atomic_write
from compress.losses import MelSpectrogramLoss, MultiResolutionSTFTLoss
from models.interface import SynthesisRequest, Utterance
from models.sampling import VitsSampling
from models.piper.vits import HifiGanGenerator, VitsHyperParams, hyperparams_from_dict

if TYPE_CHECKING:  # the voice pulls in onnx and espeak, which the GPU machine does not need
    from models.piper.voice import PiperVoice

STUDENT_KIND = "piper_hifigan"
TEACHER_PREFIX = "teacher_decoder."  # dataset-file keys of the teacher decoder's weights
# Distillation noise: Piper's own inference defaults, so the student learns the latents it will
# be given at synthesis time.
DISTILLATION_NOISE = VitsSampling(noise_scale=0.667, length_scale=1.0, noise_scale_w=0.8, seed=0)


# ---------------------------------------------------------------- decoder configs (rebuild with shapes)


def _convolutions(module: nn.Module) -> dict[str, nn.Module]:
    return {name: layer for name, layer in module.named_modules() if isinstance(layer, (nn.Conv1d, nn.ConvTranspose1d))}


def convolution_channels(module: nn.Module) -> dict[str, list[int]]:
    """``[in_channels, out_channels]`` of every convolution, by module name."""
    return {name: [layer.in_channels, layer.out_channels] for name, layer in _convolutions(module).items()}


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


def _resized(layer: nn.Module, in_channels: int, out_channels: int) -> nn.Module:
    common = dict(kernel_size=layer.kernel_size, stride=layer.stride, padding=layer.padding,
                  dilation=layer.dilation, groups=layer.groups, bias=layer.bias is not None)
    if isinstance(layer, nn.ConvTranspose1d):
        return nn.ConvTranspose1d(in_channels, out_channels, output_padding=layer.output_padding, **common)
    return nn.Conv1d(in_channels, out_channels, **common)


def resize_convolutions(module: nn.Module, channels: dict[str, list[int]]) -> nn.Module:
    """Replace each named convolution of ``module`` by one with ``[in, out]`` channels, in place."""
    layers = _convolutions(module)
    for name, (in_channels, out_channels) in channels.items():
        if name not in layers:
            raise ValueError(f"config channels: no convolution {name!r}; known: {sorted(layers)}")
        parent_name, _, attribute = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attribute, _resized(layers[name], in_channels, out_channels))
    return module


def build_decoder(config: dict) -> HifiGanGenerator:
    """A randomly initialised decoder with the shapes ``config`` describes (load weights after)."""
    if config.get("kind") != STUDENT_KIND:
        raise ValueError(f"student config kind={config.get('kind')!r}: only {STUDENT_KIND!r} is known")
    unknown = sorted(set(config) - {"kind", "hyperparams", "channels"})
    if unknown:
        raise ValueError(f"student config: unknown keys {unknown}; accepted: ['channels', 'hyperparams', 'kind']")
    decoder = HifiGanGenerator(hyperparams_from_dict(config["hyperparams"]))
    return resize_convolutions(decoder, config.get("channels", {}))


def save_module(module: nn.Module, config: dict, weights_path: Path, config_path: Path) -> None:
    """Weights as safetensors and the shapes as JSON, each written beside its target then renamed."""
    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    atomic_write(weights_path, lambda tmp: save_file(state, tmp))
    text = json.dumps(config, indent=1)
    atomic_write(config_path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def save_decoder(decoder: nn.Module, hp: VitsHyperParams, weights_path: Path, config_path: Path) -> None:
    save_module(decoder, decoder_config(decoder, hp), weights_path, config_path)


def load_decoder(weights_path: Path, config_path: Path) -> HifiGanGenerator:
    decoder = build_decoder(json.loads(Path(config_path).read_text(encoding="utf-8")))
    decoder.load_state_dict(load_file(str(weights_path)), strict=True)
    return decoder


# ---------------------------------------------------------------- teacher latents and their audio


@dataclass
class LatentDataset:
    """The teacher's decoder input for each utterance, unpadded, and the teacher decoder itself.

    Targets are the teacher decoder's audio for the very segment the student sees, computed when a
    batch is drawn. Slicing the audio of the whole utterance instead would ask the student for
    context it is not given: HiFi-GAN's receptive field spans about ten frames each side, and that
    mismatch alone costs about 0.25 MR-STFT on 32-frame segments, a floor no student could reach.
    """

    latents: list[torch.Tensor]  # each (C_lat, T_frames_i)
    teacher_decoder: nn.Module
    teacher_decoder_config: dict
    hop_length: int
    sample_rate_hz: int

    @classmethod
    def from_voice(cls, voice: PiperVoice, sentences: Sequence[str] | Sequence[Utterance],
                   noise: VitsSampling = DISTILLATION_NOISE, synthesis_batch_size: int = 8,
                   log_every: int = 0) -> "LatentDataset":
        """Run the teacher up to its flow output (the decoder's input) on every sentence.

        Sentences are batched by length (less padding); batch k draws its noise from seed
        ``noise.seed + k``, so the dataset is the same on every run.
        """
        hp = voice.model.hp
        if hp.num_speakers > 1:
            raise ValueError(f"LatentDataset.from_voice: voice has {hp.num_speakers} speakers; "
                             "only single-speaker voices are supported so far")
        sequences = [s for item in sentences for s in ([item] if isinstance(item, Utterance)
                                                       else voice.text_to_utterances(item))]
        if not sequences:
            raise ValueError("LatentDataset.from_voice: no sentences given")
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
        return cls(latents, teacher_decoder, decoder_config(decoder, hp), hp.hop_length, voice.sample_rate_hz)

    @property
    def total_frames(self) -> int:
        return sum(z.shape[1] for z in self.latents)

    def save(self, path: Path, dtype: torch.dtype = torch.float16) -> None:
        """One safetensors file: latents concatenated along time, frame lengths, teacher decoder.

        float16 latents halve the file (a GPU call carries at most 64 MiB); the teacher decodes
        the same rounded latents the student sees, so the rounding costs the targets nothing. The
        teacher decoder stays float32 (6.7 MB for the medium voice).
        """
        tensors = {
            "z": torch.cat(self.latents, dim=1).to(dtype).contiguous(),  # (C_lat, sum T_frames)
            "frame_lengths": torch.tensor([z.shape[1] for z in self.latents], dtype=torch.int64),
        }
        tensors |= {f"{TEACHER_PREFIX}{k}": v.detach().float().cpu().contiguous()
                    for k, v in self.teacher_decoder.state_dict().items()}
        metadata = {"hop_length": str(self.hop_length), "sample_rate_hz": str(self.sample_rate_hz),
                    "teacher_decoder_config": json.dumps(self.teacher_decoder_config)}
        atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))

    @classmethod
    def load(cls, paths: Path | Sequence[Path]) -> "LatentDataset":
        """One file, or shards made from the same voice (carried to the GPU machine in separate calls)."""
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        latents, metadata, teacher_state = [], None, None
        for path in paths:
            with safe_open(str(path), framework="pt") as handle:
                shard_metadata = handle.metadata()
            tensors = load_file(str(path))
            shard_teacher = {k[len(TEACHER_PREFIX):]: v for k, v in tensors.items() if k.startswith(TEACHER_PREFIX)}
            if metadata is not None and (shard_metadata != metadata or any(
                    not torch.equal(v, teacher_state[k]) for k, v in shard_teacher.items())):
                raise ValueError(f"dataset shard {path} comes from another teacher than {paths[0]}")
            metadata, teacher_state = shard_metadata, shard_teacher
            latents += list(torch.split(tensors["z"].float(), tensors["frame_lengths"].tolist(), dim=1))
        config = json.loads(metadata["teacher_decoder_config"])
        teacher_decoder = build_decoder(config)
        teacher_decoder.load_state_dict(teacher_state, strict=True)
        return cls(latents, teacher_decoder.eval().requires_grad_(False), config,
                   int(metadata["hop_length"]), int(metadata["sample_rate_hz"]))


class SegmentSampler:
    """Random latent segments and the teacher's audio for them; batch ``step`` depends only on (seed, step).

    That makes training resumable bit for bit: a resumed run sees the batches it would have seen.
    Utterances shorter than a segment are never drawn. The teacher decodes on ``device``.
    """

    def __init__(self, dataset: LatentDataset, batch_size: int, segment_frames: int, seed: int,
                 device: str | torch.device = "cpu"):
        if batch_size < 1 or segment_frames < 1:
            raise ValueError(f"batch_size={batch_size}, segment_frames={segment_frames}: both must be >= 1")
        self.dataset = dataset
        self.batch_size = batch_size
        self.segment_frames = segment_frames
        self.seed = seed
        self.device = torch.device(device)
        self.teacher_decoder = dataset.teacher_decoder.to(self.device)
        self.eligible = [i for i, z in enumerate(dataset.latents) if z.shape[1] >= segment_frames]
        if not self.eligible:
            longest = max(z.shape[1] for z in dataset.latents)
            raise ValueError(f"segment_frames={segment_frames}: no utterance is that long (longest: {longest} frames)")

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(z (B, C_lat, segment_frames), audio (B, segment_frames * hop)) on the sampler's device."""
        rng = np.random.default_rng([self.seed, step])
        frames = self.segment_frames
        latents = []
        for index in rng.choice(self.eligible, size=self.batch_size):
            z = self.dataset.latents[index]
            start = int(rng.integers(0, z.shape[1] - frames + 1))
            latents.append(z[:, start : start + frames])
        z = torch.stack(latents).to(self.device)  # (B, C_lat, segment_frames)
        with torch.no_grad():  # not inference_mode: the loss saves the target for its backward
            audio = self.teacher_decoder(z)[:, 0]  # (B, segment_frames * hop)
        return z, audio

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        step = 0
        while True:
            yield self.batch(step)
            step += 1


def teacher_latent_batches(voice: PiperVoice, sentences: Sequence[str] | Sequence[Utterance],
                           batch_size: int, segment_frames: int, seed: int) -> SegmentSampler:
    """Endless (z (B, C_lat, segment_frames), audio (B, segment_frames * hop)) batches from the teacher.

    Iterate it, or ask for ``.batch(step)``. The teacher's text-to-latent half runs once per
    sentence, up front; its decoder runs per batch, on the segment drawn.
    """
    dataset = LatentDataset.from_voice(voice, sentences, dataclasses.replace(DISTILLATION_NOISE, seed=seed))
    return SegmentSampler(dataset, batch_size, segment_frames, seed)


# ---------------------------------------------------------------- training


@dataclass(frozen=True)
class LossWeights:
    stft: float = 1.0  # multi-resolution STFT: spectral convergence + log magnitude
    mel: float = 1.0  # log-mel L1 (HiFi-GAN's reconstruction term); same order as the STFT term here

    def __post_init__(self):
        if min(self.stft, self.mel) < 0 or self.stft + self.mel == 0:
            raise ValueError(f"loss weights {self}: need both >= 0 and at least one > 0")


class DistillationLoss(nn.Module):
    def __init__(self, sample_rate_hz: int, hop_length: int, weights: LossWeights = LossWeights()):
        super().__init__()
        self.weights = weights
        self.stft = MultiResolutionSTFTLoss()
        self.mel = MelSpectrogramLoss(sample_rate_hz, hop_length)

    def forward(self, predicted: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """(B, T) waveforms -> {"loss", "stft", "mel"}; "loss" is the weighted sum to minimise."""
        parts = {"stft": self.stft(predicted, target), "mel": self.mel(predicted, target)}
        parts["loss"] = self.weights.stft * parts["stft"] + self.weights.mel * parts["mel"]
        return parts


def _save_checkpoint(path: Path, student: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    state = {"model": student.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def learning_rate(step: int, steps: int, peak_lr: float, final_lr_fraction: float, warmup_steps: int) -> float:
    """Linear warm-up to ``peak_lr``, then cosine down to ``peak_lr * final_lr_fraction`` at ``steps``.

    A function of the step alone, so a resumed run needs no scheduler state. Warm-up matters when
    fine-tuning: Adam's first updates move every weight by about ``lr`` at once.
    """
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = min((step - warmup_steps) / max(steps - warmup_steps, 1), 1.0)
    return peak_lr * (final_lr_fraction + (1 - final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


def train_decoder(
    student: nn.Module,
    batches: SegmentSampler,
    steps: int,
    lr: float,
    checkpoint_path: Path,
    device: str = "cpu",
    loss_weights: LossWeights = LossWeights(),
    log_every: int = 50,
    checkpoint_every: int = 500,
    max_steps_this_call: int | None = None,
    grad_clip_norm: float = 1.0,  # norms run 10-50; clipping to 1 gave a slightly lower loss than none
    final_lr_fraction: float = 1.0,
    warmup_steps: int = 0,
    autocast_bf16: bool = False,
) -> dict:
    """Train ``student`` (z (B, C, T) -> audio (B, 1, T * hop)) toward the teacher's audio.

    AdamW with HiFi-GAN's betas, gradient clipping, a checkpoint (model, optimizer, step) every
    ``checkpoint_every`` steps and at the end of the call, written atomically. A checkpoint found
    at ``checkpoint_path`` is resumed; ``max_steps_this_call`` bounds one call, so a long run goes
    in chunks. ``autocast_bf16`` runs the student's forward in bfloat16 (CUDA; weights stay fp32).
    Returns the step reached and the losses of this call.
    """
    if steps < 0 or lr <= 0 or checkpoint_every < 1:
        raise ValueError(f"train_decoder: need steps >= 0, lr > 0, checkpoint_every >= 1 "
                         f"(got {steps}, {lr}, {checkpoint_every})")
    checkpoint_path = Path(checkpoint_path)
    student.to(device).train()
    criterion = DistillationLoss(batches.dataset.sample_rate_hz, batches.dataset.hop_length, loss_weights).to(device)
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, betas=(0.8, 0.99))  # HiFi-GAN's betas
    start_step = 0
    if checkpoint_path.is_file():
        state = torch.load(checkpoint_path, map_location=device, weights_only=True)
        student.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step = int(state["step"])
    end_step = steps if max_steps_this_call is None else min(steps, start_step + max_steps_this_call)

    history: list[dict[str, float]] = []
    started = time.perf_counter()
    step = start_step
    while step < end_step:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, lr, final_lr_fraction, warmup_steps)
        z, target = (t.to(device, non_blocking=True) for t in batches.batch(step))
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=autocast_bf16):
            predicted = student(z)[:, 0]  # (B, T_audio)
        parts = criterion(predicted.float(), target)
        optimizer.zero_grad(set_to_none=True)
        parts["loss"].backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), grad_clip_norm)
        optimizer.step()
        step += 1
        history.append({k: v.item() for k, v in parts.items()} | {"grad_norm": float(grad_norm)})
        if log_every and (step % log_every == 0 or step == end_step):
            window = history[-log_every:]
            means = {k: sum(h[k] for h in window) / len(window) for k in window[0]}
            print(f"step {step}/{steps}  " + "  ".join(f"{k} {v:.4f}" for k, v in means.items())
                  + f"  {(step - start_step) / (time.perf_counter() - started):.2f} steps/s", flush=True)
        if step % checkpoint_every == 0 or step == end_step:
            _save_checkpoint(checkpoint_path, student, optimizer, step)
    seconds = time.perf_counter() - started
    summary = {"step": step, "start_step": start_step, "steps_this_call": step - start_step,
               "done": step >= steps, "seconds": seconds}
    if history:
        tail = history[-min(len(history), max(log_every, 1)):]
        summary |= {"loss_first": history[0]["loss"], "loss_last": history[-1]["loss"],
                    "loss_tail_mean": sum(h["loss"] for h in tail) / len(tail),
                    "steps_per_s": len(history) / seconds}
    return summary


# ---------------------------------------------------------------- CLI


def _make_dataset(args: argparse.Namespace) -> None:
    from models.piper.voice import PiperVoice  # needs onnx and espeak: only where the dataset is made
    from texts.training_text import generate_training_sentences

    torch.set_num_threads(args.threads)
    voice = PiperVoice.load(args.voice)
    sentences = generate_training_sentences(args.count, args.seed)
    dataset = LatentDataset.from_voice(voice, sentences, dataclasses.replace(DISTILLATION_NOISE, seed=args.seed),
                                       log_every=10)
    dataset.save(Path(args.out), dtype=getattr(torch, args.dtype))
    seconds = dataset.total_frames * dataset.hop_length / dataset.sample_rate_hz
    print(f"wrote {args.out}: {len(dataset.latents)} utterances, {seconds:.0f} s of audio, "
          f"{Path(args.out).stat().st_size / 1e6:.1f} MB")
    if args.student_config_out:
        text = json.dumps(dataset.teacher_decoder_config, indent=1)
        atomic_write(Path(args.student_config_out), lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def _train(args: argparse.Namespace) -> None:
    torch.backends.cudnn.benchmark = True  # fixed segment shapes: let cuDNN pick its fastest kernels once
    dataset = LatentDataset.load(args.dataset)
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
    parser = argparse.ArgumentParser(prog="python -m compress.decoder_training", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    make = commands.add_parser("make-dataset", help="cache teacher latents (and the teacher decoder) for training sentences")
    make.add_argument("--voice", default="bundled:joe")
    make.add_argument("--count", type=int, default=400, help="training sentences (about 3.7 s, 123 kB each at float16)")
    make.add_argument("--seed", type=int, default=0, help="training-text and noise seed")
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
