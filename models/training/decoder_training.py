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
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from core.atomic_io import atomic_write, write_text_atomic
from models.training.discriminators import AdversarialSettings, HifiGanDiscriminator, adversarial_terms
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

    def save(self, path: Path, dtype: torch.dtype = torch.float16, utterances: slice = slice(None),
             teacher_dtype: torch.dtype | None = torch.float32, shard: tuple[int, int, str] | None = None,
             teacher_keys: Collection[str] | None = None) -> None:
        """One safetensors file: latents concatenated along time, frame lengths, teacher decoder.

        float16 latents halve the file (a GPU call carries at most 64 MiB); the teacher decodes
        the same rounded latents the student sees, so the rounding costs the targets nothing. The
        teacher decoder stays float32 (6.7 MB for the medium voice) unless ``teacher_dtype`` says
        otherwise (its floating-point tensors only); None leaves it out, ``teacher_keys`` keeps
        only those of its tensors. ``utterances``: which go in (none only beside teacher tensors);
        ``shard``: (index, count, dataset id) of a file ``save_shards`` writes.
        """
        chosen = self.latents[utterances]
        teacher = {} if teacher_dtype is None else {
            k: v for k, v in self.teacher_decoder.state_dict().items() if teacher_keys is None or k in teacher_keys}
        if not chosen and not teacher:
            raise ValueError(f"nothing to save in {path}: no utterances and no teacher tensors")
        z = torch.cat(chosen, dim=1) if chosen else self.latents[0].new_zeros(self.latents[0].shape[0], 0)
        tensors = {
            "z": z.to(dtype).contiguous(),  # (C_lat, sum T_frames)
            "frame_lengths": torch.tensor([z.shape[1] for z in chosen], dtype=torch.int64),
        }
        tensors |= {f"{TEACHER_PREFIX}{k}": (v.detach().to(teacher_dtype) if v.is_floating_point() else v.detach())
                    .cpu().contiguous() for k, v in teacher.items()}
        metadata = {"hop_length": str(self.hop_length), "sample_rate_hz": str(self.sample_rate_hz),
                    "teacher_decoder_config": json.dumps(self.teacher_decoder_config)}
        if shard is not None:
            metadata |= {"shard_index": str(shard[0]), "shard_count": str(shard[1]), "dataset_id": shard[2]}
        atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))

    def save_shards(self, folder: Path, stem: str, max_mib: float = 24.0, dtype: torch.dtype = torch.float16,
                    teacher_dtype: torch.dtype = torch.float16) -> list[Path]:
        """``<stem>-000.safetensors``, ... of at most ``max_mib`` of tensors each, for GPU calls that
        carry 64 MiB at most with the project's working tree (about 37 MiB): the teacher's tensors
        first, then the utterances in order, packed across the shards. The teacher may span shards
        (Kokoro's generator is 37.5 MiB in float16), so the limit is set by the call, not the model.
        Earlier shards of ``stem`` in ``folder`` are removed first; ``load`` wants every shard of one
        writing (each names its index, the count and the writing's id)."""
        if not self.latents:
            raise ValueError("the dataset has no utterances")
        limit = max_mib * 2**20
        teacher_sizes = {k: v.numel() * (teacher_dtype.itemsize if v.is_floating_point() else v.element_size())
                         for k, v in self.teacher_decoder.state_dict().items()}
        sizes = [z.numel() * dtype.itemsize for z in self.latents]
        if max(teacher_sizes.values(), default=0) > limit or max(sizes) > limit:
            raise ValueError(f"max_mib={max_mib} is too small: a shard must hold the largest teacher tensor "
                             f"({max(teacher_sizes.values(), default=0) / 2**20:.1f} MiB) and the largest utterance "
                             f"({max(sizes) / 2**20:.1f} MiB)")
        # Greedy packing in order: the teacher's tensors, then the utterances, a new shard when full.
        items = [("teacher", key, size) for key, size in teacher_sizes.items()] + \
                [("utterance", index, size) for index, size in enumerate(sizes)]
        bins: list[list[tuple[str, str | int, int]]] = [[]]
        used = 0
        for item in items:
            if used + item[2] > limit and bins[-1]:
                bins.append([])
                used = 0
            bins[-1].append(item)
            used += item[2]
        groups = []
        for contents in bins:
            keys = [name for kind, name, _ in contents if kind == "teacher"]
            indices = [name for kind, name, _ in contents if kind == "utterance"]
            groups.append((keys, slice(indices[0], indices[-1] + 1) if indices else slice(0, 0)))
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(f"{stem}-*.safetensors"):
            stale.unlink()
        dataset_id = uuid.uuid4().hex
        paths = []
        for index, (keys, utterances) in enumerate(groups):
            path = folder / f"{stem}-{index:03d}.safetensors"
            self.save(path, dtype, utterances, teacher_dtype if keys else None, (index, len(groups), dataset_id),
                      teacher_keys=keys)
            paths.append(path)
        return paths

    @classmethod
    def load(cls, paths: Path | Sequence[Path], build_decoder: Callable[[dict], nn.Module]) -> "LatentDataset":
        """One file, or every shard of one ``save_shards`` writing (carried to the GPU machine in
        separate calls), or files of the same voice each with its teacher.

        ``build_decoder``: the family's decoder from the config saved with the dataset.
        """
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        latents, shared, teacher_state, shards = [], None, {}, {}
        for path in paths:
            with safe_open(str(path), framework="pt") as handle:
                metadata = dict(handle.metadata())
            shard = tuple(metadata.pop(key, None) for key in ("shard_index", "shard_count", "dataset_id"))
            if shard[0] is not None:
                shards[path] = shard
            if shared is not None and metadata != shared:
                raise ValueError(f"dataset file {path} comes from another teacher than {paths[0]}")
            shared = metadata
            tensors = load_file(str(path))
            file_teacher = {k[len(TEACHER_PREFIX):]: v for k, v in tensors.items() if k.startswith(TEACHER_PREFIX)}
            # Shards of one writing each hold part of the teacher; whole files each hold all of it.
            keys_differ = (shard[0] is None and bool(teacher_state) and bool(file_teacher)
                           and file_teacher.keys() != teacher_state.keys())
            if keys_differ or any(k in teacher_state and not torch.equal(v, teacher_state[k])
                                  for k, v in file_teacher.items()):
                raise ValueError(f"dataset file {path} comes from another teacher than {paths[0]}")
            teacher_state |= file_teacher
            if len(tensors["frame_lengths"]):
                latents += list(torch.split(tensors["z"].float(), tensors["frame_lengths"].tolist(), dim=1))
        if shards:
            _check_complete_shards(shards, len(paths))
        if not teacher_state:
            raise ValueError(f"no teacher decoder weights in {[str(p) for p in paths]}: give the first shard too")
        config = json.loads(shared["teacher_decoder_config"])
        teacher_decoder = build_decoder(config)
        teacher_decoder.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in teacher_state.items()},
                                        strict=True)
        return cls(latents, teacher_decoder.eval().requires_grad_(False), config,
                   int(shared["hop_length"]), int(shared["sample_rate_hz"]))


def write_bundle_record(out: Path, voice, sentences: int, provenance: dict) -> None:
    """``bundle.json`` beside a teacher-forced training bundle: the family, the sentences it holds,
    the sample rate and where they came from (``compress.distil prepare``'s provenance)."""
    write_text_atomic(Path(out) / "bundle.json", json.dumps({"family": voice.family, "sentences": sentences,
                                                             "sample_rate_hz": voice.sample_rate_hz, **provenance}))


def _check_complete_shards(shards: dict, files: int) -> None:
    """Every shard of one writing, each once, and no other file beside them."""
    ids = {dataset_id for _, _, dataset_id in shards.values()}
    counts = {int(count) for _, count, _ in shards.values()}
    indices = sorted(int(index) for index, _, _ in shards.values())
    if len(ids) > 1 or len(shards) != files or len(counts) > 1 or indices != list(range(counts.pop())):
        raise ValueError(f"shards {[str(p) for p in shards]} are not one whole writing: each of save_shards' "
                         "files, once, and nothing else")


class SegmentSampler:
    """Random latent segments and the teacher's audio for them; batch ``step`` depends only on (seed, step).

    That makes training resumable bit for bit: a resumed run sees the batches it would have seen.
    Utterances shorter than a segment are never drawn. The teacher decodes on ``device``.

    ``pool_segments`` > 0 draws that many segments once and decodes them up front; batches are then
    drawn from that pool. On a CPU the teacher's decode is about half of a training step, so a
    pool nearly doubles the steps per second, at the price of a finite set of segments. ``log_every``
    > 0 prints the pool's progress every that many decoded batches.
    """

    def __init__(self, dataset: LatentDataset, batch_size: int, segment_frames: int, seed: int,
                 device: str | torch.device = "cpu", pool_segments: int = 0, log_every: int = 0):
        if batch_size < 1 or segment_frames < 1 or pool_segments < 0:
            raise ValueError(f"batch_size={batch_size}, segment_frames={segment_frames}, pool_segments="
                             f"{pool_segments}: need batch and segment >= 1 and pool >= 0")
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
        self.pool = self._decode_pool(pool_segments, log_every) if pool_segments else None

    def _segments(self, rng: np.random.Generator, count: int) -> torch.Tensor:
        """(count, C_lat, segment_frames) on the sampler's device, each from a random utterance and start."""
        frames = self.segment_frames
        latents = []
        for index in rng.choice(self.eligible, size=count):
            z = self.dataset.latents[index]
            start = int(rng.integers(0, z.shape[1] - frames + 1))
            latents.append(z[:, start : start + frames])
        return torch.stack(latents).to(self.device)

    def _decode(self, z: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # not inference_mode: the loss saves the target for its backward
            return self.teacher_decoder(z)[:, 0]  # (B, segment_frames * hop)

    def _decode_pool(self, count: int, log_every: int) -> tuple[torch.Tensor, torch.Tensor]:
        # A stream of its own: steps seed [seed, step] with step < 2**32, so this one never collides.
        rng = np.random.default_rng([self.seed, 2**32])
        z = self._segments(rng, count)  # (count, C_lat, segment_frames)
        started = time.perf_counter()
        audio = []
        for first in range(0, count, self.batch_size):
            audio.append(self._decode(z[first : first + self.batch_size]))
            done = first + len(audio[-1])
            if log_every and (len(audio) % log_every == 0 or done == count):
                print(f"pool: {done}/{count} segments decoded, {time.perf_counter() - started:.0f} s", flush=True)
        return z, torch.cat(audio)  # (count, C_lat, segment_frames), (count, segment_frames * hop)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(z (B, C_lat, segment_frames), audio (B, segment_frames * hop)) on the sampler's device."""
        rng = np.random.default_rng([self.seed, step])
        if self.pool is not None:
            rows = torch.from_numpy(rng.choice(len(self.pool[0]), size=self.batch_size)).to(self.device)
            return self.pool[0][rows], self.pool[1][rows]
        z = self._segments(rng, self.batch_size)
        return z, self._decode(z)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        step = 0
        while True:
            yield self.batch(step)
            step += 1


def _means(records: list[dict[str, float]]) -> dict[str, float]:
    """Each loss part's mean over the records that hold it (the adversarial terms begin after a warm-up)."""
    keys = dict.fromkeys(key for record in records for key in record)  # first-seen order
    return {key: float(np.mean([record[key] for record in records if key in record])) for key in keys}


def _save_checkpoint(path: Path, student: nn.Module, optimizer: torch.optim.Optimizer, step: int,
                     discriminator: nn.Module | None = None, d_optimizer: torch.optim.Optimizer | None = None,
                     adversarial_from_step: int = 0) -> None:
    state = {"model": student.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    if discriminator is not None:
        state |= {"discriminator": discriminator.state_dict(), "d_optimizer": d_optimizer.state_dict(),
                  "adversarial_from_step": adversarial_from_step}
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
    max_seconds_this_call: float | None = None,
    grad_clip_norm: float = 1.0,  # norms run 10-50; clipping to 1 gave a slightly lower loss than none
    final_lr_fraction: float = 1.0,
    warmup_steps: int = 0,
    autocast_bf16: bool = False,
    adversarial: AdversarialSettings | None = None,
) -> dict:
    """Train ``student`` (z (B, C, T) -> audio (B, 1, T * hop)) toward the teacher's audio.

    AdamW with HiFi-GAN's betas, gradient clipping, a checkpoint (model, optimizer, step) every
    ``checkpoint_every`` steps and at the end of the call, written atomically. A checkpoint found
    at ``checkpoint_path`` is resumed; ``max_steps_this_call`` and ``max_seconds_this_call`` bound
    one call (the call ends after the step that crosses either, with a checkpoint), so a long run
    goes in chunks that fit a machine lent for minutes. ``autocast_bf16`` runs the student's
    forward in bfloat16 (CUDA; weights stay fp32). ``adversarial`` adds a compact HiFi-GAN
    discriminator that takes the teacher's audio as real and the student's as fake. Its state joins
    the checkpoint, with the step it joined at: a spectral checkpoint may go on adversarially, and
    the discriminator's warm-up counts from there. A checkpoint with a discriminator is refused
    without ``adversarial`` (the next save would drop it).
    Returns the step reached and the mean of each loss part over this call's last ``log_every`` steps.
    """
    seconds_bound_bad = max_seconds_this_call is not None and max_seconds_this_call <= 0
    if steps < 0 or lr <= 0 or checkpoint_every < 1 or seconds_bound_bad:
        raise ValueError(f"train_decoder: need steps >= 0, lr > 0, checkpoint_every >= 1, max_seconds_this_call > 0 "
                         f"(got {steps}, {lr}, {checkpoint_every}, {max_seconds_this_call})")
    checkpoint_path = Path(checkpoint_path)
    student.to(device).train()
    criterion = DistillationLoss(batches.dataset.sample_rate_hz, batches.dataset.hop_length, loss_weights).to(device)
    optimizer = torch.optim.AdamW(student.parameters(), lr=lr, betas=(0.8, 0.99))  # HiFi-GAN's betas
    discriminator = d_optimizer = None
    if adversarial is not None:
        discriminator = HifiGanDiscriminator.compact().to(device).train()
        d_optimizer = torch.optim.AdamW(discriminator.parameters(), lr=lr, betas=(0.8, 0.99))
    start_step = adversarial_from = 0
    if checkpoint_path.is_file():
        state = torch.load(checkpoint_path, map_location=device, weights_only=True)
        if discriminator is None and "discriminator" in state:
            raise ValueError(f"{checkpoint_path} holds a discriminator: resume it adversarially, or start a "
                             "new checkpoint from its student")
        student.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_step = int(state["step"])
        adversarial_from = start_step
        if discriminator is not None and "discriminator" in state:
            discriminator.load_state_dict(state["discriminator"])
            d_optimizer.load_state_dict(state["d_optimizer"])
            adversarial_from = int(state["adversarial_from_step"])
    end_step = steps if max_steps_this_call is None else min(steps, start_step + max_steps_this_call)

    history: list[dict[str, float]] = []
    started = time.perf_counter()
    step = start_step
    while step < end_step:
        for group in optimizer.param_groups + (d_optimizer.param_groups if d_optimizer else []):
            group["lr"] = learning_rate(step, steps, lr, final_lr_fraction, warmup_steps)
        z, target = (t.to(device, non_blocking=True) for t in batches.batch(step))
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=autocast_bf16):
            predicted = student(z)[:, 0]  # (B, T_audio)
        parts = criterion(predicted.float(), target)
        loss = parts["loss"]
        if discriminator is not None:
            parts |= adversarial_terms(discriminator, d_optimizer, adversarial, step - adversarial_from, target,
                                       predicted.float())
            if "adv" in parts:
                loss = loss + adversarial.generator_loss(parts)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), grad_clip_norm)
        optimizer.step()
        step += 1
        if max_seconds_this_call is not None and time.perf_counter() - started >= max_seconds_this_call:
            end_step = step
        history.append({k: v.item() for k, v in parts.items()} | {"grad_norm": float(grad_norm)})
        if log_every and (step % log_every == 0 or step == end_step):
            means = _means(history[-log_every:])
            print(f"step {step}/{steps}  " + "  ".join(f"{k} {v:.4f}" for k, v in means.items())
                  + f"  {(step - start_step) / (time.perf_counter() - started):.2f} steps/s", flush=True)
        if step % checkpoint_every == 0 or step == end_step:
            _save_checkpoint(checkpoint_path, student, optimizer, step, discriminator, d_optimizer, adversarial_from)
    seconds = time.perf_counter() - started
    summary = {"step": step, "start_step": start_step, "steps_this_call": step - start_step,
               "done": step >= steps, "seconds": seconds}
    if history:
        tail = _means(history[-min(len(history), max(log_every, 1)):])
        summary |= {"loss_first": history[0]["loss"], "loss_last": history[-1]["loss"],
                    **{f"{k}_tail_mean": v for k, v in tail.items() if k != "grad_norm"},
                    "steps_per_s": len(history) / seconds}
    return summary
