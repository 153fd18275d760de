r"""A student's quality curve: score the eval audio a chunked GPU training run wrote, log it to MLflow,
pick the best step.

Each chunk of a run (models/piper/training/lite_training.py ``--eval-out``) leaves
``eval_stepNNNNNN.npz``: the teacher's and the student's audio for held-out eval sentences (never
Harvard), on the same noise. Here, where the metrics' models live, each file is scored:

- ``dnsmos_p808``: DNSMOS P.808 of the student's audio (and ``teacher_dnsmos_p808`` beside it);
- ``mcd_db``: mel-cepstral distortion of the student against the teacher;
- ``spk_sim``: speaker similarity of the student to the teacher.

    python -m compress.training_curve --eval-dir .device/gan/run --run-name lite_gan \
        --out docs/results/lite_gan/curve.json

The best step is the highest ``dnsmos_p808`` among the steps that keep the speaker and the
spectrum (``spk_sim >= --min-spk-sim`` and ``mcd_db <= --max-mcd-db``); if no step does, the one
with the highest ``spk_sim`` (the run then failed its constraints, and the JSON says so).
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import mlflow
import numpy as np

from core.atomic_io import write_text_atomic
from core.publishing import add_allow_dirty_argument, publication_or_exit
from evaluate.dnsmos import dnsmos_p808
from evaluate.mcd import mel_cepstral_distortion
from evaluate.speaker import speaker_similarity

REPO_ROOT = Path(__file__).resolve().parent.parent
EVAL_FILE = re.compile(r"eval_step(\d+)\.npz$")
INT16_FULL_SCALE = 32767.0


@dataclass(frozen=True)
class StepScore:
    step: int
    sentences: int
    dnsmos_p808: float
    teacher_dnsmos_p808: float
    mcd_db: float
    spk_sim: float
    source: str  # the file scored


def read_eval_audio(path: Path) -> tuple[int, int, list[tuple[np.ndarray, np.ndarray]]]:
    """(step, sample rate, [(teacher, student) float32 waveforms]) from one eval file; no pickles."""
    with np.load(path, allow_pickle=False) as files:
        names = sorted(name for name in files.files if name.startswith("teacher_"))
        if not names:
            raise ValueError(f"{path}: no teacher_NNN arrays; not an eval file of lite_training --eval-out")
        pairs = []
        for name in names:
            student_name = "student_" + name.removeprefix("teacher_")
            if student_name not in files.files:
                raise ValueError(f"{path}: {name} has no {student_name}")
            pairs.append((files[name].astype(np.float32) / INT16_FULL_SCALE,
                          files[student_name].astype(np.float32) / INT16_FULL_SCALE))
        return int(files["step"]), int(files["sample_rate_hz"]), pairs


def score_file(path: Path) -> StepScore:
    step, sample_rate_hz, pairs = read_eval_audio(path)
    student_mos = [dnsmos_p808(student, sample_rate_hz) for _, student in pairs]
    teacher_mos = [dnsmos_p808(teacher, sample_rate_hz) for teacher, _ in pairs]
    mcd = [mel_cepstral_distortion(student, teacher, sample_rate_hz) for teacher, student in pairs]
    similarity = [speaker_similarity(student, teacher, sample_rate_hz) for teacher, student in pairs]
    return StepScore(step, len(pairs), float(np.mean(student_mos)), float(np.mean(teacher_mos)),
                     float(np.mean(mcd)), float(np.mean(similarity)), str(path))


def eval_files(directory: Path) -> list[Path]:
    files = sorted((p for p in Path(directory).iterdir() if EVAL_FILE.search(p.name)),
                   key=lambda p: int(EVAL_FILE.search(p.name).group(1)))
    if not files:
        raise FileNotFoundError(f"no eval_stepNNNNNN.npz in {directory}")
    return files


def failed_constraints(score: StepScore, min_spk_sim: float, max_mcd_db: float) -> list[str]:
    """The constraints ``score`` misses, as readable rules (empty: it meets them)."""
    checks = ((f"spk_sim >= {min_spk_sim}", score.spk_sim >= min_spk_sim),
              (f"mcd_db <= {max_mcd_db}", score.mcd_db <= max_mcd_db))
    return [rule for rule, held in checks if not held]


def best_step(scores: list[StepScore], min_spk_sim: float, max_mcd_db: float) -> tuple[StepScore, bool]:
    """(the chosen step, whether it meets the constraints); the rule is the module docstring's."""
    eligible = [s for s in scores if not failed_constraints(s, min_spk_sim, max_mcd_db)]
    if eligible:
        return max(eligible, key=lambda s: s.dnsmos_p808), True
    return max(scores, key=lambda s: s.spk_sim), False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m compress.training_curve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval-dir", required=True, type=Path, help="where the run's eval_stepNNNNNN.npz are")
    parser.add_argument("--run-name", required=True, help="the MLflow run that holds the curve")
    parser.add_argument("--tracking-uri", default="sqlite:///outputs/mlflow.db")
    parser.add_argument("--experiment", default="student_training")
    parser.add_argument("--min-spk-sim", type=float, default=0.95)
    parser.add_argument("--max-mcd-db", type=float, default=1.0)
    parser.add_argument("--out", type=Path, help="the curve and the choice as JSON")
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    provenance = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    scores = []
    for path in eval_files(args.eval_dir):
        scores.append(score_file(path))
        s = scores[-1]
        print(f"step {s.step:>6}  dnsmos_p808 {s.dnsmos_p808:.3f} (teacher {s.teacher_dnsmos_p808:.3f})  "
              f"mcd_db {s.mcd_db:.3f}  spk_sim {s.spk_sim:.3f}  ({s.sentences} sentences)", flush=True)
    chosen, meets = best_step(scores, args.min_spk_sim, args.max_mcd_db)
    failed = failed_constraints(chosen, args.min_spk_sim, args.max_mcd_db)
    print(f"best: step {chosen.step} ({'fails ' + ', '.join(failed) if failed else 'meets the constraints'})")
    mlflow.set_tracking_uri(args.tracking_uri)
    mlflow.set_experiment(args.experiment)
    with mlflow.start_run(run_name=args.run_name):
        mlflow.set_tags({"eval_dir": str(args.eval_dir), "best_step": str(chosen.step),
                         "best_meets_constraints": str(meets)})
        for s in scores:
            mlflow.log_metrics({"dnsmos_p808": s.dnsmos_p808, "teacher_dnsmos_p808": s.teacher_dnsmos_p808,
                                "mcd_db": s.mcd_db, "spk_sim": s.spk_sim}, step=s.step)
    if args.out:
        record = {"curve": [asdict(s) for s in scores], "best": asdict(chosen), "best_meets_constraints": meets,
                  "rule": {"maximize": "dnsmos_p808", "min_spk_sim": args.min_spk_sim,
                           "max_mcd_db": args.max_mcd_db}, "provenance": provenance}
        write_text_atomic(args.out, json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
