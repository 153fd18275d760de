"""Teacher-forced decoder training, for any family whose decoder turns latent frames into audio:
a student decoder learns to turn the teacher's latents into the teacher's audio.

    dataset = LatentDataset.load(path, build_decoder)  # a family writes it from its teacher (latents + decoder)
    sampler = SegmentSampler(dataset, batch_size=16, segment_frames=32, seed=0)
    train_decoder(student, sampler, steps=20000, lr=2e-4, checkpoint_path=Path("ckpt.pt"))

Torch, numpy and safetensors only, so it runs on the GPU machine as it is.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from core.atomic_io import atomic_write
from models.training.losses import DistillationLoss, LossWeights
from models.training.schedule import learning_rate

TEACHER_PREFIX = "teacher_decoder."  # dataset-file keys of the teacher decoder's weights


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
    teacher_decoder_config: dict  # the family's JSON description its decoder is rebuilt from
    hop_length: int
    sample_rate_hz: int

    @property
    def total_frames(self) -> int:
        return sum(z.shape[1] for z in self.latents)

    def save(self, path: Path, dtype: torch.dtype = torch.float16, latents: slice = slice(None),
             teacher_dtype: torch.dtype | None = torch.float32) -> None:
        """One safetensors file: latents concatenated along time, frame lengths, teacher decoder.

        float16 latents halve the file (a GPU call carries at most 64 MiB); the teacher decodes
        the same rounded latents the student sees, so the rounding costs the targets nothing. The
        teacher decoder stays float32 (6.7 MB for the medium voice) unless ``teacher_dtype`` says
        otherwise; None leaves it out (a shard after the first, ``save_shards``). ``latents``: which
        utterances go in.
        """
        chosen = self.latents[latents]
        tensors = {
            "z": torch.cat(chosen, dim=1).to(dtype).contiguous(),  # (C_lat, sum T_frames)
            "frame_lengths": torch.tensor([z.shape[1] for z in chosen], dtype=torch.int64),
        }
        if teacher_dtype is not None:
            tensors |= {f"{TEACHER_PREFIX}{k}": v.detach().to(teacher_dtype).cpu().contiguous()
                        for k, v in self.teacher_decoder.state_dict().items()}
        metadata = {"hop_length": str(self.hop_length), "sample_rate_hz": str(self.sample_rate_hz),
                    "teacher_decoder_config": json.dumps(self.teacher_decoder_config)}
        atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))

    def save_shards(self, folder: Path, stem: str, max_mib: float = 60.0,
                    dtype: torch.dtype = torch.float16) -> list[Path]:
        """Files of at most about ``max_mib`` each, for GPU calls that carry 64 MiB at most: the
        teacher (in float16) in the first only, the utterances in order across all. ``load`` takes
        them back together."""
        folder.mkdir(parents=True, exist_ok=True)
        limit = max_mib * 2**20
        teacher_bytes = sum(v.numel() * 2 for v in self.teacher_decoder.state_dict().values())
        if teacher_bytes >= limit:
            raise ValueError(f"the teacher alone is {teacher_bytes / 2**20:.1f} MiB: over max_mib={max_mib}")
        element = torch.finfo(dtype).bits // 8
        paths, start, used = [], 0, teacher_bytes
        for index, z in enumerate(self.latents + [None]):
            size = 0 if z is None else z.numel() * element
            if z is None or (used + size > limit and index > start):
                path = folder / f"{stem}-{len(paths):03d}.safetensors"
                self.save(path, dtype, slice(start, index), torch.float16 if not paths else None)
                paths.append(path)
                start, used = index, 0
            used += size
        return paths

    @classmethod
    def load(cls, paths: Path | Sequence[Path], build_decoder: Callable[[dict], nn.Module]) -> "LatentDataset":
        """One file, or shards made from the same voice (carried to the GPU machine in separate calls).

        ``build_decoder``: the family's decoder from the config saved with the dataset.
        """
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        latents, metadata, teacher_state = [], None, None
        for path in paths:
            with safe_open(str(path), framework="pt") as handle:
                shard_metadata = handle.metadata()
            tensors = load_file(str(path))
            shard_teacher = {k[len(TEACHER_PREFIX):]: v for k, v in tensors.items() if k.startswith(TEACHER_PREFIX)}
            if metadata is not None and shard_metadata != metadata:
                raise ValueError(f"dataset shard {path} comes from another teacher than {paths[0]}")
            if shard_teacher and teacher_state is not None and (shard_teacher.keys() != teacher_state.keys() or any(
                    not torch.equal(v, teacher_state[k]) for k, v in shard_teacher.items())):
                raise ValueError(f"dataset shard {path} comes from another teacher than {paths[0]}")
            metadata = shard_metadata
            teacher_state = teacher_state or shard_teacher or None  # save_shards: the first shard holds it
            latents += list(torch.split(tensors["z"].float(), tensors["frame_lengths"].tolist(), dim=1))
        if teacher_state is None:
            raise ValueError(f"no teacher decoder weights in {[str(p) for p in paths]}: give the first shard too")
        config = json.loads(metadata["teacher_decoder_config"])
        teacher_decoder = build_decoder(config)
        teacher_decoder.load_state_dict({k: v.float() for k, v in teacher_state.items()}, strict=True)
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


def _save_checkpoint(path: Path, student: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    state = {"model": student.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    atomic_write(path, lambda tmp: torch.save(state, tmp))


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
