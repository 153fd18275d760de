"""Finished variant evaluations kept on disk, so that a long run stopped part way resumes from the
variants it finished instead of scoring them again.

Why: the full table (Harvard lists 1-36, a dozen variants, DNSMOS + Whisper + MCD + speaker
similarity) takes longer on two cores than one working session lasts. With this cache, the same
command run again picks up where the last one stopped; the interleaved speed rounds, which must
run in one process, run at the end of whichever run finishes the list.

A finished evaluation is reused only under the same key:

- the same code: HEAD's files in the folders that make or score audio, with no uncommitted change
  in them (a dirty tree caches nothing: its results could not be traced to a commit). Checkpoints
  and training states are data, not code: a checkpoint counts through the stage setting that names
  it, by its content (so committing a training run's state re-scores nothing);
- the same settings that shape the audio and its scores (``model``, ``data``, ``evaluate`` but the
  speed rounds and the GPU figures merged in, ``export``) and the same sentences;
- the same settings of the stages that build the variant and the reference it is scored against
  (``stages.<key>`` along each one's chain of sources): another INT8 calibrator re-scores the INT8
  variants and what is built from them, not the teacher or a Lite student.

The reference variant's waveforms are kept whole (later variants are scored against them); other
variants keep the ``evaluate.audio_samples`` the run logs. A record made on another processor has
its single-run speed figures dropped (``rtf_*``, ``latency_*``): the interleaved rounds of the
finishing run re-time every variant, and nothing measured elsewhere is shown as this machine's.
Families with their own measures (``Family.measure_variant``) hand an in-memory reference from
variant to variant, so their runs are not cached.
"""
from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.atomic_io import atomic_write, write_text_atomic
from core.revision import code_tree_identity, cpu_model, git_revision
from evaluate.runner import VariantEvaluation

# What makes or scores a variant's audio (git pathspecs); docs, notebooks, scripts and the server do not.
CODE_PATHSPECS = ("compress", "conf", "core", "evaluate", "export", "models", ":(exclude)models/checkpoints",
                  "texts", "pyproject.toml")
# Settings that change no variant's audio or its quality scores.
_EVALUATE_KEYS_IGNORED = ("speed_rounds", "gpu_results")
_KEYED_SECTIONS = ("model", "data", "evaluate", "export")
_MACHINE_BOUND_PREFIXES = ("rtf_", "latency_")
FORMAT = 1


@dataclass(frozen=True)
class ReusedEvaluation:
    evaluation: VariantEvaluation
    origin: str  # where it was measured, for the variant's MLflow tags


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def evaluation_key(resolved_config: dict, sentences: list[str], code_identity: str) -> str:
    """sha256 over the code identity, the settings every variant shares and the sentences."""
    keyed = {section: resolved_config.get(section) for section in _KEYED_SECTIONS}
    keyed["evaluate"] = {k: v for k, v in (keyed["evaluate"] or {}).items() if k not in _EVALUATE_KEYS_IGNORED}
    return _digest({"format": FORMAT, "code": code_identity, "settings": keyed, "sentences": sentences})


def with_file_digests(settings: object, root: Path | None) -> object:
    """``settings`` with every string that names a file (absolute, or relative to ``root``) replaced
    by its path and content hash: a retrained checkpoint under the same name is another variant."""
    if isinstance(settings, dict):
        return {key: with_file_digests(value, root) for key, value in settings.items()}
    if isinstance(settings, list):
        return [with_file_digests(value, root) for value in settings]
    if isinstance(settings, str) and settings:
        path = Path(settings) if Path(settings).is_absolute() or root is None else Path(root) / settings
        if path.is_file():
            return {"path": settings, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return settings


class EvaluationCache:
    """One run's finished evaluations, in ``folder`` (``<output_dir>/evaluations/<family>/<key>``)."""

    def __init__(self, folder: Path, commit: str, root: Path | None = None):
        self.folder = Path(folder)
        self.commit = commit
        self.root = Path(root) if root is not None else None  # where relative file settings point

    @classmethod
    def for_run(cls, root: Path, output_dir: Path, family: str, resolved_config: dict,
                sentences: list[str]) -> tuple["EvaluationCache | None", str]:
        """(the cache, a line for the log); no cache when the code folders have uncommitted changes."""
        identity = code_tree_identity(root, CODE_PATHSPECS)
        if identity is None:
            return None, "evaluations are not kept: the code has uncommitted changes (or no git checkout)"
        key = evaluation_key(resolved_config, sentences, identity)
        folder = Path(output_dir) / "evaluations" / family / key[:16]
        return cls(folder, git_revision(root), root), f"finished evaluations are kept in {folder}"

    def _paths(self, variant: str, stage_settings: dict) -> tuple[Path, Path]:
        stem = f"{variant}-{_digest(with_file_digests(stage_settings, self.root))[:12]}"
        return self.folder / f"{stem}.json", self.folder / f"{stem}.npz"

    def save(self, variant: str, stage_settings: dict, evaluation: VariantEvaluation,
             keep_waveforms: int | None) -> None:
        """``stage_settings``: those of the stages behind the variant and its reference (the pipeline's
        ``stage_settings_chain``). ``keep_waveforms``: how many of the first waveforms to keep; None keeps all."""
        record_path, audio_path = self._paths(variant, stage_settings)
        waveforms = evaluation.waveforms if keep_waveforms is None else evaluation.waveforms[:keep_waveforms]
        arrays = {f"w{i:05d}": wave.detach().cpu().float().numpy() for i, wave in enumerate(waveforms)}
        self.folder.mkdir(parents=True, exist_ok=True)

        def write_audio(tmp: str) -> None:
            with open(tmp, "wb") as handle:
                np.savez(handle, **arrays)

        # The audio first: the record's presence is what marks the evaluation finished.
        atomic_write(audio_path, write_audio)
        record = {"format": FORMAT, "variant": variant, "stage_settings": stage_settings, "metrics": evaluation.metrics,
                  "sample_rate_hz": evaluation.sample_rate_hz, "waveforms": len(arrays),
                  "utterances": len(evaluation.waveforms), "cpu": cpu_model(),
                  "commit": self.commit,
                  "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        write_text_atomic(record_path, json.dumps(record, indent=1))

    def load(self, variant: str, stage_settings: dict, needed_waveforms: int | None) -> ReusedEvaluation | None:
        """The finished evaluation of ``variant`` under this key and these stage settings, or None.
        ``needed_waveforms``: how many the run will read (None: all of them, the reference's)."""
        record_path, audio_path = self._paths(variant, stage_settings)
        if not record_path.is_file() or not audio_path.is_file():
            return None
        record = json.loads(record_path.read_text(encoding="utf-8"))
        wanted = record["utterances"] if needed_waveforms is None else min(needed_waveforms, record["utterances"])
        if record["waveforms"] < wanted:
            return None  # kept as a later variant's samples, now wanted whole (as the reference)
        with np.load(audio_path, allow_pickle=False) as arrays:
            waveforms = [torch.from_numpy(arrays[name].copy()) for name in sorted(arrays.files)]
        metrics = dict(record["metrics"])
        origin = f"reused: measured {record['date_utc']} at {record['commit'][:12]} on {record['cpu']}"
        if record["cpu"] != cpu_model():
            metrics = {k: v for k, v in metrics.items() if not k.startswith(_MACHINE_BOUND_PREFIXES)}
            origin += " (another processor: its single-run speed figures dropped)"
        return ReusedEvaluation(VariantEvaluation(metrics, waveforms, int(record["sample_rate_hz"])), origin)

