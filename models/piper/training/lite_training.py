r"""Distilling a Piper voice into the Lite student (models/piper/lite.py): a slim flow and an
iSTFT-head decoder behind the teacher's own text encoder and duration predictor.

Training is online distillation: every step draws training sentences (``texts.training_text``,
never eval or Harvard), runs the teacher up to its prior sample and its flow, and teaches the
student to map the same prior sample to the teacher's audio:

    loss = MR-STFT + mel (student audio vs teacher audio on a segment)
           + latent_weight * MSE(student flow output, teacher flow output)   # feature matching

The teacher decodes exactly the latent segment the student decodes (see
models/training/decoder_training.py on why a slice of the whole utterance's audio would be an
unreachable target).

The distillation stage (compress/distil.py) reaches this through models/piper/training/hooks.py.
Training on the GPU machine, in bounded chunks that resume from the checkpoint directory (the
whole state in safetensors shards under 16 MiB, models/training/sharded_state.py; torch + numpy +
safetensors there; espeak only here, where the bundle is prepared):

    python -m compress.distil prepare --family piper --voice bundled:joe --sentences 12000 --out .device/distil
    python -m models.piper.training.lite_training train --bundle .device/distil --checkpoint $OUT/state \
        --steps 24000 --max-seconds 450 --device cuda --export $OUT/lite_student.safetensors

With ``--gan`` the student also learns against a discriminator (HiFi-GAN's multi-period and
multi-scale, compact so the state comes back from one call), and ``--eval-out`` writes the
teacher's and the student's audio for the bundle's held-out eval sentences at the end of each
call; ``python -m compress.training_curve`` scores those files here (DNSMOS, MCD, speaker
similarity) into MLflow and picks the best step.
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from core.atomic_io import atomic_write
from models.piper.lite import (LITE_CONFIG_METADATA_KEY, LiteStudent, LiteStudentConfig, build_lite_parts, load_student,
                               slice_segments)
from models.piper.training.decoder_student import DISTILLATION_NOISE
from models.piper.vits import PiperVits, hyperparams_from_dict
from models.sampling import VitsSampling
from models.training.discriminators import AdversarialSettings, HifiGanDiscriminator, adversarial_terms
from models.training.losses import DistillationLoss, LossWeights
from models.training.schedule import learning_rate
from models.training.sharded_state import has_state, load_state, save_state


# ---------------------------------------------------------------- the student and the teacher's targets


class PriorTap(nn.Module):
    """A flow that records its input (the prior sample) and mask, then runs the wrapped flow.

    Installed with ``replace_part("flow", ...)`` on a copy of the teacher, it yields the student's
    input and the teacher's flow output from one ``infer_latent`` call.
    """

    def __init__(self, flow: nn.Module):
        super().__init__()
        self.flow = flow
        self.z_prior: torch.Tensor | None = None
        self.mask: torch.Tensor | None = None

    def reverse(self, z: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        self.z_prior, self.mask = z, mask  # (B, C_lat, T_frames), (B, 1, T_frames)
        return self.flow.reverse(z, mask, g)


def padded_batch(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Phoneme ids (B, T_text) zero-padded, and their lengths (B,)."""
    lengths = torch.tensor([len(ids) for ids in sequences])
    ids = torch.zeros(len(sequences), int(lengths.max()), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
    return ids, lengths


class TeacherTargets:
    """Batch ``step`` of teacher targets; a function of (seed, step) alone, so training resumes exactly."""

    def __init__(self, teacher: PiperVits, phoneme_ids: list[list[int]], batch_size: int, segment_frames: int,
                 seed: int, device: str, noise: VitsSampling = DISTILLATION_NOISE):
        if not phoneme_ids:
            raise ValueError("TeacherTargets: no training sentences")
        self.teacher = copy.deepcopy(teacher).float().to(device).eval().requires_grad_(False)
        self.tap = PriorTap(self.teacher.parts()["flow"])
        self.teacher.replace_part("flow", self.tap)
        self.decoder = self.teacher.parts()["decoder"]
        self.phoneme_ids = phoneme_ids
        self.batch_size, self.segment_frames, self.seed, self.device = batch_size, segment_frames, seed, device
        self.noise = noise

    @torch.no_grad()
    def batch(self, step: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step])
        chosen = [self.phoneme_ids[i] for i in rng.choice(len(self.phoneme_ids), size=self.batch_size)]
        phoneme_ids, lengths = padded_batch(chosen)  # (B, T_text), (B,)
        # Noise drawn where the teacher runs: the prior noise is a large tensor (B, C_lat, 16 T_text),
        # and drawing it on the CPU every step took longer than the step itself on the H200.
        generator = torch.Generator(self.device).manual_seed(int(rng.integers(2**31)))
        batch, text_length, channels = len(chosen), phoneme_ids.shape[1], self.teacher.hp.latent_channels
        duration_noise = torch.randn(batch, 2, text_length, generator=generator, device=self.device)
        prior_noise = torch.randn(batch, channels, text_length * self.noise.max_frames_per_phoneme_id,
                                  generator=generator, device=self.device)
        latent = self.teacher.infer_latent(
            phoneme_ids.to(self.device), lengths.to(self.device), duration_noise, prior_noise,
            self.noise.noise_scale, self.noise.length_scale, self.noise.noise_scale_w)
        frames = latent.frame_lengths.cpu()
        starts = torch.tensor([int(rng.integers(0, max(int(n) - self.segment_frames, 0) + 1)) for n in frames])
        starts = starts.to(self.device)
        audio = self.decoder(slice_segments(latent.z, starts, self.segment_frames))[:, 0]  # (B, S * hop)
        return {"z_prior": self.tap.z_prior, "mask": self.tap.mask, "z": latent.z, "starts": starts, "audio": audio}


def _batch_on_stream(targets: TeacherTargets, step: int,
                     stream: torch.cuda.Stream | None) -> tuple[dict[str, torch.Tensor], torch.cuda.Event | None]:
    """``targets.batch(step)``, queued on ``stream`` when given, with the event that marks it done there."""
    if stream is None:
        return targets.batch(step), None
    with torch.cuda.stream(stream):
        batch = targets.batch(step)
        ready = torch.cuda.Event()
        ready.record(stream)
    return batch, ready


def prefetched_batches(targets: TeacherTargets, first_step: int, end_step: int,
                       prefetch: bool) -> Iterator[dict[str, torch.Tensor]]:
    """``targets.batch(step)`` for step = first_step .. end_step - 1, the same batches either way.

    With ``prefetch`` a worker thread computes the batch of step + 1 while the caller trains on
    step's: on the H200 a step is bound by the host launching kernels, the teacher's share of them
    too, and PyTorch releases the GIL inside its ops, so the teacher's launches can overlap the
    student's (what it gained is in models/checkpoints/README.md). One worker, never more:
    ``TeacherTargets.batch`` is not re-entrant (its ``PriorTap`` keeps the last prior it saw). On CUDA the worker queues on a
    stream of its own; the caller's stream waits for the batch's event, and the batch's tensors are
    marked as used there so the allocator does not hand their memory back to the worker too early.
    Close the iterator (``contextlib.closing``) to stop the worker when a caller stops early.
    """
    if not prefetch:
        for step in range(first_step, end_step):
            yield targets.batch(step)
        return
    if first_step >= end_step:
        return
    device = torch.device(targets.device)
    stream = None
    if device.type == "cuda":
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))  # the teacher's weights, copied on the caller's stream
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="teacher-targets") as worker:
        pending = worker.submit(_batch_on_stream, targets, first_step, stream)
        for step in range(first_step, end_step):
            batch, ready = pending.result()
            if step + 1 < end_step:
                pending = worker.submit(_batch_on_stream, targets, step + 1, stream)
            if ready is not None:
                consumer = torch.cuda.current_stream(device)
                consumer.wait_event(ready)
                for tensor in batch.values():
                    tensor.record_stream(consumer)
            yield batch


# ---------------------------------------------------------------- training


def student_state(student: LiteStudent) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().contiguous() for k, v in student.state_dict().items()}


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load ``saved`` into ``optimizer`` keeping this optimizer's implementation (fused or not).

    ``load_state_dict`` takes every param_group entry from the saved state, the ``fused`` and
    ``foreach`` flags too, so a state saved by the unfused AdamW (a CPU run's, or any saved with
    the foreach implementation) would silently switch a fused optimizer back. The moments and step
    counts are the same tensors either way.
    """
    if len(saved["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(f"optimizer state has {len(saved['param_groups'])} parameter groups, the optimizer "
                         f"{len(optimizer.param_groups)}: the state is of another model or optimizer")
    groups = [saved_group | {key: group[key] for key in ("fused", "foreach") if key in group}
              for saved_group, group in zip(saved["param_groups"], optimizer.param_groups, strict=True)]
    optimizer.load_state_dict(saved | {"param_groups": groups})


def _as_floats(records: list[dict[str, torch.Tensor]]) -> list[dict[str, float]]:
    """The recorded loss parts as Python floats, through one device-to-host copy for all of them."""
    values = iter(torch.stack([value for record in records for value in record.values()]).tolist())
    return [{key: next(values) for key in record} for record in records]


def train_lite(student: LiteStudent, targets: TeacherTargets, steps: int, lr: float, checkpoint_dir: Path,
               sample_rate_hz: int, latent_weight: float = 1.0, warmup_steps: int = 200,
               final_lr_fraction: float = 0.05, max_steps_this_call: int | None = None,
               max_seconds: float | None = None, log_every: int = 100, checkpoint_every: int = 500,
               autocast_bf16: bool = False, loss_weights: LossWeights = LossWeights(),
               adversarial: AdversarialSettings | None = None, prefetch: bool | None = None) -> dict:
    """Train ``student`` toward the teacher; resumes from ``checkpoint_dir``; bounded by steps and seconds.

    AdamW with HiFi-GAN's betas, clipped gradients, warm-up then cosine decay (a function of the
    step: a resumed run needs no scheduler state, and batches are a function of the step too, so a
    resumed run equals an uninterrupted one). The state (model, optimizer, step, and the
    discriminator and its optimizer when ``adversarial`` is set) is written as shards every
    ``checkpoint_every`` steps and when the call ends. With ``adversarial``, a compact HiFi-GAN
    discriminator takes the teacher's audio as real and the student's as fake. With ``prefetch``
    (default: on CUDA) the teacher's next batch is made on a worker thread while a step trains
    (``prefetched_batches``); the loss parts are read back only when logged.
    """
    if steps < 1 or lr <= 0:
        raise ValueError(f"train_lite: need steps >= 1 and lr > 0 (got {steps}, {lr})")
    device = targets.device
    on_cuda = torch.device(device).type == "cuda"
    student.to(device).train()
    criterion = DistillationLoss(sample_rate_hz, targets.teacher.hp.hop_length, loss_weights).to(device)
    # Fused on CUDA: a few kernels per step instead of the foreach AdamW's many small ones (the step
    # is bound by launching kernels); the CPU keeps the implementation its tests were written against.
    fused = True if on_cuda else None
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, betas=(0.8, 0.99), fused=fused)
    discriminator = d_optimizer = None
    if adversarial is not None:
        discriminator = HifiGanDiscriminator.compact().to(device).train()
        d_optimizer = torch.optim.AdamW(discriminator.parameters(), lr=lr, betas=(0.8, 0.99), fused=fused)
    step = 0
    if has_state(checkpoint_dir):
        state = load_state(checkpoint_dir, device)
        student.load_state_dict(state["model"])
        load_optimizer_state(optimizer, state["optimizer"])
        if discriminator is not None and "discriminator" in state:  # a spectral run may continue adversarially
            discriminator.load_state_dict(state["discriminator"])
            load_optimizer_state(d_optimizer, state["d_optimizer"])
        step = int(state["step"])
    start_step, started = step, time.perf_counter()
    end_step = steps if max_steps_this_call is None else min(steps, step + max_steps_this_call)

    def save() -> None:
        state = {"model": student.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        if discriminator is not None:
            state |= {"discriminator": discriminator.state_dict(), "d_optimizer": d_optimizer.state_dict()}
        save_state(Path(checkpoint_dir), state)

    # The loss parts stay on the device until a log line or the summary needs them: reading a
    # value every step would make the host wait for the GPU, and the host is what bounds a step.
    history: deque[dict[str, torch.Tensor]] = deque(maxlen=max(log_every, 1))
    prefetch = on_cuda if prefetch is None else prefetch
    with closing(prefetched_batches(targets, step, end_step, prefetch)) as batches:
        while step < end_step and (max_seconds is None or time.perf_counter() - started < max_seconds):
            for group in optimizer.param_groups + (d_optimizer.param_groups if d_optimizer else []):
                group["lr"] = learning_rate(step, steps, lr, final_lr_fraction, warmup_steps)
            batch = next(batches)
            with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16,
                                enabled=autocast_bf16):
                z, audio = student(batch["z_prior"], batch["mask"], batch["starts"], targets.segment_frames)
            parts = criterion(audio.float(), batch["audio"])
            mask = batch["mask"]
            parts["latent"] = ((z.float() - batch["z"]) ** 2 * mask).sum() / (mask.sum() * z.shape[1])
            loss = parts["loss"] + latent_weight * parts["latent"]
            if discriminator is not None:  # the teacher's audio (B, S * hop) is the real side
                parts |= adversarial_terms(discriminator, d_optimizer, adversarial, step, batch["audio"], audio.float())
                if "adv" in parts:
                    loss = loss + adversarial.generator_loss(parts)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
            optimizer.step()
            step += 1
            history.append({k: v.detach().float() for k, v in parts.items()})
            if log_every and step % log_every == 0:
                window = _as_floats(list(history))
                print(f"step {step}/{steps} " + " ".join(f"{k} {sum(h[k] for h in window) / len(window):.4f}"
                                                         for k in window[0])
                      + f" {(step - start_step) / (time.perf_counter() - started):.1f} steps/s", flush=True)
            if step % checkpoint_every == 0:
                save()
    save()
    seconds = time.perf_counter() - started
    tail = _as_floats(list(history)) if history else []
    return {"step": step, "start_step": start_step, "done": step >= steps, "seconds": seconds,
            "steps_per_s": (step - start_step) / seconds if seconds else 0.0,
            **({f"{k}_tail_mean": sum(h[k] for h in tail) / len(tail) for k in tail[0]} if tail else {})}


@torch.no_grad()
def write_eval_audio(path: Path, teacher: PiperVits, student: LiteStudent, phoneme_ids: list[list[int]], step: int,
                     sample_rate_hz: int, noise: VitsSampling = DISTILLATION_NOISE) -> None:
    """The teacher's and the student's audio for held-out sentences, as int16 in one ``.npz``.

    Sentence i draws its noise from seed i on the teacher's device, and both models share the
    teacher's text encoder and durations, so the two waveforms of a sentence align sample for
    sample: MCD and speaker similarity compare like with like. Scored here by compress/training_curve.py.
    """
    device = next(teacher.parameters()).device
    was_training = student.training
    student.eval()
    lite = copy.deepcopy(teacher)
    lite.replace_part("flow", student.flow)
    lite.replace_part("decoder", student.decoder)
    arrays: dict[str, np.ndarray] = {"step": np.array(step), "sample_rate_hz": np.array(sample_rate_hz)}
    for index, ids in enumerate(phoneme_ids):
        generator = torch.Generator(device).manual_seed(index)
        text = torch.tensor([ids], device=device)  # (1, T_text)
        lengths = torch.tensor([len(ids)], device=device)
        duration_noise = torch.randn(1, 2, len(ids), generator=generator, device=device)
        prior_noise = torch.randn(1, teacher.hp.latent_channels, len(ids) * noise.max_frames_per_phoneme_id,
                                  generator=generator, device=device)
        for name, model in (("teacher", teacher), ("student", lite)):
            audio, audio_lengths, _ = model(text, lengths, duration_noise, prior_noise, noise.noise_scale,
                                            noise.length_scale, noise.noise_scale_w)
            waveform = audio[0, : int(audio_lengths[0])].float().clamp(-1, 1).cpu().numpy()
            arrays[f"{name}_{index:03d}"] = np.round(waveform * 32767).astype(np.int16)
    student.train(was_training)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.savez(handle, **arrays)

    atomic_write(Path(path), write)


def save_student(student: LiteStudent, config: LiteStudentConfig, path: Path, card: dict) -> None:
    metadata = {LITE_CONFIG_METADATA_KEY: json.dumps(config.to_dict()), "training": json.dumps(card)}
    atomic_write(Path(path), lambda tmp: save_file(student_state(student), tmp, metadata=metadata))


# ---------------------------------------------------------------- CLI: train on the GPU machine


def _train(args: argparse.Namespace) -> None:
    bundle, teacher = load_training_bundle(Path(args.bundle))
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    # No cudnn.benchmark: sentence lengths change every step, and re-tuning each new shape held
    # the first H200 run to 1.3-2.8 steps/s.
    config = LiteStudentConfig.from_dict(json.loads(args.student_config) if args.student_config else {})
    parts = build_lite_parts(teacher.hp, config)
    student = LiteStudent(parts["flow"], parts["decoder"])
    if args.init and not has_state(args.checkpoint):
        student.load_state_dict(load_file(args.init), strict=True)
    targets = TeacherTargets(teacher, bundle["phoneme_ids"], args.batch_size, args.segment_frames, args.seed,
                             args.device)
    summary = train_lite(student, targets, args.steps, args.lr, Path(args.checkpoint), bundle["sample_rate_hz"],
                         args.latent_weight, args.warmup_steps, args.final_lr_fraction,
                         max_seconds=args.max_seconds, log_every=args.log_every, autocast_bf16=args.bf16,
                         loss_weights=LossWeights(args.stft_weight, args.mel_weight),
                         adversarial=AdversarialSettings(
                             discriminator_warmup_steps=args.discriminator_warmup_steps) if args.gan else None)
    print(json.dumps(summary))
    if args.eval_out:
        eval_ids = bundle.get("eval_phoneme_ids")
        if not eval_ids:
            raise SystemExit(f"--eval-out: {args.bundle}/bundle.json has no eval_phoneme_ids "
                             "(prepare the bundle with --eval-sentences N)")
        path = Path(args.eval_out) / f"eval_step{summary['step']:06d}.npz"
        write_eval_audio(path, targets.teacher, student, eval_ids, summary["step"], bundle["sample_rate_hz"])
        print(f"wrote {path}")
    if args.export:
        card = {"steps": summary["step"], "done": summary["done"], "lr": args.lr, "batch_size": args.batch_size,
                "segment_frames": args.segment_frames, "latent_weight": args.latent_weight, "bf16": args.bf16,
                "gan": args.gan, "stft_weight": args.stft_weight, "mel_weight": args.mel_weight,
                "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
                "training_sequences": len(bundle["phoneme_ids"]), "training_text_seed": bundle["training_text_seed"],
                "teacher_weights": "float16-rounded teacher, upcast to float32", "init": args.init, **summary}
        save_student(student, config, Path(args.export), card)
        print(f"wrote {args.export}")


def load_training_bundle(bundle_dir: Path) -> tuple[dict, PiperVits]:
    bundle = json.loads((bundle_dir / "bundle.json").read_text(encoding="utf-8"))
    teacher = PiperVits(hyperparams_from_dict(bundle["hyperparams"]))
    teacher.load_state_dict({k: v.float() for k, v in load_file(str(bundle_dir / "teacher.safetensors")).items()})
    return bundle, teacher.eval()


def _student_from(args: argparse.Namespace, teacher: PiperVits) -> tuple[LiteStudent, LiteStudentConfig, int]:
    """(student, its config, its step) from --student (safetensors) or --checkpoint (a run's state)."""
    if args.student:
        parts, config = load_student(teacher.hp, Path(args.student))
        with safe_open(args.student, framework="pt") as handle:
            step = int(json.loads(handle.metadata().get("training", "{}")).get("steps", 0))
        return LiteStudent(parts["flow"], parts["decoder"]), config, step
    config = LiteStudentConfig.from_dict(json.loads(args.student_config) if args.student_config else {})
    student = LiteStudent(*build_lite_parts(teacher.hp, config).values())
    state = load_state(args.checkpoint)
    student.load_state_dict(state["model"])
    return student, config, int(state["step"])


def _eval(args: argparse.Namespace) -> None:
    bundle, teacher = load_training_bundle(Path(args.bundle))
    student, _, step = _student_from(args, teacher)
    step = step if args.step is None else args.step
    path = Path(args.out) / f"eval_step{step:06d}.npz"
    write_eval_audio(path, teacher, student, bundle["eval_phoneme_ids"], step, bundle["sample_rate_hz"])
    print(f"wrote {path}")


def _export(args: argparse.Namespace) -> None:
    _, teacher = load_training_bundle(Path(args.bundle))
    student, config, step = _student_from(args, teacher)
    card = json.loads(args.card) if args.card else {}
    save_student(student, config, Path(args.out), {"steps": step, "state": str(args.checkpoint), **card})
    print(f"wrote {args.out} (step {step})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m models.piper.training.lite_training", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train the Lite student; resumes from the --checkpoint directory")
    train.add_argument("--bundle", required=True)
    train.add_argument("--checkpoint", required=True, help="directory of the run's state shards")
    train.add_argument("--steps", type=int, required=True, help="total steps of the run (not of this call)")
    train.add_argument("--max-seconds", type=float, help="stop this call after this long (checkpoint kept)")
    train.add_argument("--device", default="cpu")
    train.add_argument("--student-config", help="LiteStudentConfig fields as JSON; default: its defaults")
    train.add_argument("--init", help="initial student weights (safetensors from --export); ignored when resuming")
    train.add_argument("--batch-size", type=int, default=16)
    train.add_argument("--segment-frames", type=int, default=32)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--warmup-steps", type=int, default=200)
    train.add_argument("--final-lr-fraction", type=float, default=0.05)
    train.add_argument("--latent-weight", type=float, default=1.0)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--log-every", type=int, default=200)
    train.add_argument("--bf16", action="store_true", help="student forward under bfloat16 autocast (CUDA)")
    train.add_argument("--gan", action="store_true", help="add HiFi-GAN's adversarial and feature-matching terms")
    train.add_argument("--discriminator-warmup-steps", type=int, default=1000,
                       help="with --gan: steps in which only the discriminator learns adversarially")
    train.add_argument("--eval-out", help="directory for eval_stepNNNNNN.npz: teacher and student audio of the "
                                          "bundle's eval sentences at the end of this call")
    train.add_argument("--stft-weight", type=float, default=1.0)
    train.add_argument("--mel-weight", type=float, default=1.0, help="45 with --gan, as HiFi-GAN")
    train.add_argument("--export", help="write the student's weights (safetensors + config + card) here")
    for name, help_text in (("eval", "write eval_stepNNNNNN.npz (teacher and student audio of the eval sentences)"),
                            ("export", "write a run state's student as safetensors (config + card)")):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("--bundle", required=True)
        source = command.add_mutually_exclusive_group(required=True)
        source.add_argument("--student", help="a student's safetensors (from --export)")
        source.add_argument("--checkpoint", help="a run's state directory")
        command.add_argument("--student-config", help="with --checkpoint: LiteStudentConfig fields as JSON")
        command.add_argument("--out", required=True, help="eval: a directory; export: the safetensors file")
        if name == "eval":
            command.add_argument("--step", type=int, help="the step to file it under (default: the student's own); "
                                                          "0 for the initial student of a run that starts from it")
        if name == "export":
            command.add_argument("--card", help="JSON fields added to the training card")
    args = parser.parse_args(argv)
    {"train": _train, "eval": _eval, "export": _export}[args.command](args)


if __name__ == "__main__":
    main()
