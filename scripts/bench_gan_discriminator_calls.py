"""The adversarial step's discriminator work, as lite_training runs it against the form it replaced.

    PYTHONPATH=. python3 scripts/bench_gan_discriminator_calls.py --device cuda --out $OUT/gan_disc_calls.json

Both forms do the same arithmetic on the same batch (tests/models/training/test_discriminators.py):
the discriminator's update (its loss on the teacher's and the student's audio, backward, AdamW) and
the generator's adversarial and feature-matching losses backward to the student's audio.
``separate``: four discriminator calls, the generator's losses collecting weight gradients that are
thrown away. ``stacked``: the update's two calls as one (``discriminate_pair``) and the generator's
side with the weights frozen (``generator_side_outputs``). Each round runs both forms, in
alternating order; each figure is a median over rounds, and on CUDA the kernel launches of one step are counted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from core.atomic_io import write_text_atomic
from core.revision import provenance
from evaluate.kernel_launches import kernel_launches
from models.training.discriminators import (HifiGanDiscriminator, discriminate_pair, discriminator_loss,
                                            generator_losses, generator_side_outputs)

SEGMENT_SAMPLES = 32 * 256  # lite_training's segment: 32 frames at the Piper voice's hop


def separate_step(discriminator, optimizer, real, fake) -> None:
    loss = discriminator_loss(discriminator(real), discriminator(fake.detach()))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        real_outputs = discriminator(real)
    adversarial, matching = generator_losses(real_outputs, discriminator(fake))
    (adversarial + 2 * matching).backward()


def stacked_step(discriminator, optimizer, real, fake) -> None:
    loss = discriminator_loss(*discriminate_pair(discriminator, real, fake.detach()))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    adversarial, matching = generator_losses(*generator_side_outputs(discriminator, real, fake))
    (adversarial + 2 * matching).backward()


FORMS: dict[str, Callable] = {"separate": separate_step, "stacked": stacked_step}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=32, help="lite_training's GAN runs use 32")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20, help="steps per round")
    parser.add_argument("--warmup-steps", type=int, default=5, help="untimed steps of each form first")
    parser.add_argument("--threads", type=int, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    fused = True if device.type == "cuda" else None
    torch.manual_seed(0)
    real = 0.3 * torch.randn(args.batch_size, SEGMENT_SAMPLES, device=device)  # (B, T)
    fake = (0.3 * torch.randn(args.batch_size, SEGMENT_SAMPLES, device=device)).requires_grad_(True)
    state = {}
    for name in FORMS:
        torch.manual_seed(1)
        discriminator = HifiGanDiscriminator.compact().to(device).train()
        optimizer = torch.optim.AdamW(discriminator.parameters(), lr=2e-4, betas=(0.8, 0.99), fused=fused)
        state[name] = (discriminator, optimizer)

    def run(name: str, steps: int) -> float:
        discriminator, optimizer = state[name]
        _synchronize(device)
        started = time.perf_counter()
        for _ in range(steps):
            fake.grad = None
            FORMS[name](discriminator, optimizer, real, fake)
        _synchronize(device)
        return (time.perf_counter() - started) / steps

    for name in FORMS:  # warm-up: cuDNN's algorithm choices, the allocator's pools
        run(name, args.warmup_steps)
    seconds = {name: [] for name in FORMS}
    for round_index in range(args.rounds):  # the order alternates, so neither form always runs first
        for name in (FORMS if round_index % 2 == 0 else reversed(FORMS)):
            seconds[name].append(run(name, args.steps))
    launches = {}
    if device.type == "cuda":
        for name in FORMS:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run(name, 2)
            launches[name] = kernel_launches(prof) / 2
    median = {name: statistics.median(values) for name, values in seconds.items()}
    result = {
        "what": "the adversarial step's discriminator work, separate calls against stacked calls with frozen "
                "weights on the generator's side (scripts/bench_gan_discriminator_calls.py)",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else args.device,
        "torch": torch.__version__, "threads": torch.get_num_threads(), "batch_size": args.batch_size,
        "segment_samples": SEGMENT_SAMPLES, "rounds": args.rounds, "steps_per_round": args.steps,
        "warmup_steps": args.warmup_steps,
        "step_s_median": median, "step_s_rounds": seconds,
        "stacked_speedup": median["separate"] / median["stacked"],
        "kernel_launches_per_step": launches or None, "provenance": provenance(Path(__file__).resolve().parent.parent),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "step_s_rounds"}, indent=1))
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
