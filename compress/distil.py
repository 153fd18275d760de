r"""Stage: distil the teacher into its family's small student (the ``lite`` variant): the family
says which parts the student replaces and how the student learns (``Family.distil``,
models/family.py); the other parts stay the teacher's.

In the pipeline (`python -m compress +experiment=distil`) the stage loads a committed student
checkpoint (models/checkpoints/, with its model card), or trains on this machine when
``stages.distil.checkpoint`` is null, on ``texts.training_text`` sentences or the family's named
training set (``DistilHooks.training_set``; never eval or Harvard).

Training on a GPU machine: this module prepares the family's bundle here (teacher weights and the
training sentences as phoneme ids; espeak is needed here, not there), and prints the family's
training command, which runs there in bounded chunks that resume from the checkpoint:

    python -m compress.distil prepare --family <family> --sentences 12000 --out .device/distil
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from compress.settings import NEVER_CALIBRATE_ON
from compress.variants import StageContext, Variant, require_parts
from core.config import ConfigError
from core.paths import DEFAULT_CACHE_DIR
from evaluate.memory import parameter_count, state_dict_size_mb
from models.family import DistilHooks, Family
from models.registry import FAMILIES, get_family
from texts import NAMED_SETS, load_sentences
from texts.training_text import generate_training_sentences

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class DistilSettings:
    """``stages.distil`` (conf/stages/default.yaml)."""

    checkpoint: str | None  # student weights (safetensors, relative to the repo root); null = train here
    student: dict = field(default_factory=dict)  # the family's student config fields; {} = its defaults
    train_steps: int = 0  # steps when training here (checkpoint null)
    lr: float = 1e-3
    warmup_steps: int = 200
    final_lr_fraction: float = 0.05
    batch_size: int = 16
    segment_frames: int = 32  # 32 frames = 8192 samples at hop 256
    latent_weight: float = 1.0
    training_sentences: int = 2000
    seed: int = 0

    def __post_init__(self):
        if self.checkpoint is None and self.train_steps < 1:
            raise ConfigError("stages.distil: no student to load (checkpoint is null) and none to train "
                              f"(train_steps is {self.train_steps}): set stages.distil.train_steps=N to train "
                              "one here, stages.distil.checkpoint=PATH to load one, or train it on a GPU "
                              "machine from `python -m compress.distil prepare --family FAMILY`")
        if self.checkpoint is not None and not (REPO_ROOT / self.checkpoint).is_file():
            raise ConfigError(f"stages.distil.checkpoint={self.checkpoint!r}: no such file under {REPO_ROOT}")
        if self.lr <= 0 or self.batch_size < 1 or self.segment_frames < 1 or self.latent_weight < 0:
            raise ConfigError(f"stages.distil: need lr > 0, batch_size >= 1, segment_frames >= 1, "
                              f"latent_weight >= 0 (got {self.lr}, {self.batch_size}, {self.segment_frames}, "
                              f"{self.latent_weight})")

    def check_family(self, family: Family) -> None:
        """The family has a student, and ``student`` holds its config fields (compress/stages.py calls it at start)."""
        hooks = distil_hooks(family)
        try:
            hooks.check_student_config(dict(self.student))
        except (TypeError, ValueError) as error:
            raise ConfigError(f"stages.distil.student: {error}") from error


def distil_hooks(family: Family) -> DistilHooks:
    """``family.distil``; a ConfigError naming the family when it has no student."""
    if family.distil is None:
        raise ConfigError(f"variant 'lite': family {family.name!r} has no small student (Family.distil is None); "
                          "drop 'lite' and the variants built from it from variants")
    return family.distil


def build(teacher: Variant, settings: DistilSettings, ctx: StageContext) -> Variant:
    """The ``lite`` variant: the teacher with the student's parts in place of the ones it replaces."""
    hooks = distil_hooks(ctx.family)
    require_parts("distillation", teacher, ctx.family, hooks.student_parts)
    work_dir = Path(ctx.work_dir)
    metrics: dict[str, float] = {}
    if settings.checkpoint is not None:
        weights_path = REPO_ROOT / settings.checkpoint
        tags = {"lite_source": f"checkpoint:{settings.checkpoint}"}
    else:
        weights_path = work_dir / "lite_student.safetensors"
        tags = {"lite_source": f"trained here: {settings.train_steps} steps"}
        if not weights_path.is_file():  # a finished training found here is reused (resume)
            metrics = _train_here(hooks, teacher.model, settings, work_dir, weights_path)
    parts, config = hooks.load_student(teacher.model, weights_path)
    model = copy.deepcopy(teacher.model)
    for role in hooks.student_parts:
        model.replace_part(role, parts[role].to(teacher.device))
    teacher_parts = teacher.model.parts()
    metrics |= {f"{role}_params_before": parameter_count(teacher_parts[role]) for role in hooks.student_parts}
    metrics |= {f"{role}_params_after": parameter_count(parts[role]) for role in hooks.student_parts}
    return Variant("lite", model, "torch", teacher.device, parameter_count(model) / 1e6, state_dict_size_mb(model),
                   stage_metrics=metrics, stage_tags=tags | {"lite_config": json.dumps(config)},
                   artifacts={"lite_weights": weights_path}, trained_weights=(weights_path,))


def _set_path(name_or_path: str) -> Path:
    """A sentence set's file, so a set is recognised by name or by path."""
    return Path(NAMED_SETS.get(name_or_path, name_or_path)).resolve()


def _training_phoneme_ids(hooks: DistilHooks, model, count: int, seed: int) -> list[list[int]]:
    """The family's training sentences (its named set, else the generated English ones) as phoneme ids."""
    if hooks.training_set is not None:
        held_out = {_set_path(name) for name in (*NEVER_CALIBRATE_ON, hooks.held_out_set)}
        if _set_path(hooks.training_set) in held_out:
            raise ConfigError(f"the family's distillation set {hooks.training_set!r} is held out for evaluation")
        sentences = load_sentences(hooks.training_set)[:count]
    else:
        sentences = generate_training_sentences(count, seed)
    return [seq.phoneme_ids for text in sentences for seq in model.text_to_utterances(text)]


def _train_here(hooks: DistilHooks, model, settings: DistilSettings, work_dir: Path,
                weights_path: Path) -> dict[str, float]:
    phoneme_ids = _training_phoneme_ids(hooks, model, settings.training_sentences, settings.seed)
    card = {"machine": "pipeline (this machine)", **dataclasses.asdict(settings)}
    summary = hooks.train_student(
        model, phoneme_ids, dict(settings.student), work_dir / "lite_state", weights_path, card,
        steps=settings.train_steps, lr=settings.lr, warmup_steps=settings.warmup_steps,
        final_lr_fraction=settings.final_lr_fraction, batch_size=settings.batch_size,
        segment_frames=settings.segment_frames, latent_weight=settings.latent_weight, seed=settings.seed)
    return {"distil_train_seconds": summary["seconds"], "distil_steps": float(summary["step"]),
            **{f"distil_{k}": v for k, v in summary.items() if k.endswith("_tail_mean")}}


# ---------------------------------------------------------------- CLI: prepare a GPU machine's training bundle


def _prepare(args: argparse.Namespace) -> None:
    family = get_family(args.family)
    hooks = distil_hooks(family)
    voice = args.voice or family.default_voice
    model = family.load_teacher(voice, Path(args.cache_dir))
    phoneme_ids = _training_phoneme_ids(hooks, model, args.sentences, args.seed)
    # Held-out sentences for the quality curve: the family's eval set, never Harvard (the external test set).
    eval_ids = [seq.phoneme_ids for text in load_sentences(hooks.held_out_set)[: args.eval_sentences]
                for seq in model.text_to_utterances(text)]
    hooks.write_bundle(model, phoneme_ids, Path(args.out), {"voice": voice, "training_text_seed": args.seed,
                                                            "eval_phoneme_ids": eval_ids})
    print(f"wrote {args.out}: {len(phoneme_ids)} training sequences; on the GPU machine:\n"
          + hooks.train_command.format(bundle=args.out))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m compress.distil", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="teacher weights + training phoneme ids for the GPU machine")
    prepare.add_argument("--family", required=True, choices=sorted(FAMILIES))
    prepare.add_argument("--voice", help="default: the family's default voice")
    prepare.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR, help="where the teacher's converted weights are cached")
    prepare.add_argument("--sentences", type=int, default=12000)
    prepare.add_argument("--seed", type=int, default=0)
    prepare.add_argument("--eval-sentences", type=int, default=24,
                         help="first N eval-set sentences, for the training run's quality curve")
    prepare.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    _prepare(args)


if __name__ == "__main__":
    main()
