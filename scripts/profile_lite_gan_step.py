"""Where one adversarial distillation step of the Lite student spends its time (GPU machine).

    PYTHONPATH=. python3 scripts/profile_lite_gan_step.py --bundle .device/gan/bundle --out $OUT/profile.json \
        --revision <commit>

Runs the same objects as ``lite_training train --gan`` on a scratch state directory (the run's own
state is not touched): warm-up steps, then (1) the teacher's targets alone, (2) whole steps, both
timed with a device synchronize, and (3) whole steps under torch.profiler, whose GPU-busy time
against the wall time says whether the step is bound by the GPU or by the host launching kernels.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from core.atomic_io import atomic_write
from evaluate.kernel_launches import kernel_launches
from models.piper.lite import LiteStudent, LiteStudentConfig, build_lite_parts
from models.piper.training.lite_training import TeacherTargets, load_training_bundle, train_lite
from models.training.discriminators import AdversarialSettings
from models.training.losses import LossWeights


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn, repeats: int) -> float:
    _synchronize()
    started = time.perf_counter()
    for i in range(repeats):
        fn(i)
    _synchronize()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--init", default="models/checkpoints/lite_joe_medium.safetensors")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--revision", default="unknown", help="the commit profiled (the GPU machine has no .git)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    bundle, teacher = load_training_bundle(Path(args.bundle))
    student = LiteStudent(*build_lite_parts(teacher.hp, LiteStudentConfig()).values())
    student.load_state_dict(load_file(args.init), strict=True)
    targets = TeacherTargets(teacher, bundle["phoneme_ids"], args.batch_size, 32, 0, args.device)
    adversarial = AdversarialSettings(discriminator_warmup_steps=0)
    scratch = Path(tempfile.mkdtemp())

    def steps(count: int, profiled_dir: Path) -> None:
        train_lite(student, targets, 60000, 2e-4, profiled_dir, bundle["sample_rate_hz"], 10.0,
                   max_steps_this_call=count, log_every=0, checkpoint_every=10**9,
                   loss_weights=LossWeights(1.0, 45.0), adversarial=adversarial)

    steps(10, scratch / "warm")
    teacher_s = _timed(lambda i: targets.batch(1000 + i), args.steps)
    # A call builds the discriminator and optimizers and saves the state: the difference of two
    # calls of N and 2N steps leaves the N steps alone.
    call_s = {}
    for count in (args.steps, 2 * args.steps):
        started = time.perf_counter()
        steps(count, scratch / f"timed{count}")
        _synchronize()
        call_s[count] = time.perf_counter() - started
    step_s = (call_s[2 * args.steps] - call_s[args.steps]) / args.steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        steps(args.steps, scratch / "profiled")
        _synchronize()
    # Device events only (kernels, copies, sets), not the CPU ops that launched them nor annotations
    # such as Optimizer.step, whose device totals count the same kernels again.
    device_us = sum(event.device_time_total for event in prof.events()
                    if event.device_type == DeviceType.CUDA and not event.is_user_annotation)
    launches = kernel_launches(prof)
    events = prof.key_averages()
    top = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:25]
    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
              "torch": torch.__version__, "revision": args.revision, "batch_size": args.batch_size,
              "steps_timed": args.steps, "step_s": step_s, "call_s": call_s, "teacher_targets_s": teacher_s,
              "gpu_busy_s_per_step": device_us / 1e6 / args.steps,
              "kernel_launches_per_step": launches / args.steps,
              "top_device_ops": [{"op": e.key[:90], "count": e.count // args.steps,
                                  "device_ms_per_step": e.self_device_time_total / 1e3 / args.steps}
                                 for e in top]}
    print(events.table(sort_by="self_device_time_total", row_limit=30))
    print(json.dumps({k: v for k, v in result.items() if k != "top_device_ops"}, indent=1))
    atomic_write(Path(args.out), lambda tmp: Path(tmp).write_text(json.dumps(result, indent=1), encoding="utf-8"))

if __name__ == "__main__":
    main()
