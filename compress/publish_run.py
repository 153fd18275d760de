"""Publish a finished pipeline run under docs/results: its table, its champion, and where it came from.

    python -m compress.publish_run --run-dir outputs/runs/2026-12-01_22-44-24 \
        --out docs/results/full_2026-12-01_harvard360.json --also-selection cpu

A run (``python -m compress ...``) leaves ``results.json`` (one row of metrics per variant),
``selection.json`` (the champion by its rule) and ``resolved_config.yaml`` in its run directory, and
its provenance (commit, diff hash, machine, command) as tags of its MLflow parent run. This joins
them into one file that a figure in README or docs/benchmarks.md can link to. ``--also-selection``
applies other rules of conf/selection/ to the same rows (``cpu``: the CPU champion's), so a
reader sees which variant each rule picks and why the others are ineligible, from one measurement.
The published file's own provenance (the tree this command ran from) is refused when dirty, as
every publishing command here (core/publishing.py).
"""
from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

import mlflow
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from core.atomic_io import write_text_atomic
from core.publishing import add_allow_dirty_argument, publication_or_exit
from compress.run_config import settings_from_config
from compress.selection import SelectionSettings, select_champion
from compress.settings import scored_language
from evaluate.asr import error_unit

REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_DIR_STAMP = "%Y-%m-%d_%H-%M-%S"  # Hydra's run directory name: the run's start, local time
PROVENANCE_TAGS = ("git_revision", "git_diff_sha256", "machine_cpu", "command")


def selection_settings(name: str) -> SelectionSettings:
    """conf/selection/<name>.yaml, composed as the CLI composes ``selection=<name>``."""
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        # Outside a Hydra app the run directory has no value of its own; nothing is written there.
        config = compose("config", overrides=[f"selection={name}", f"paths.root={REPO_ROOT}",
                                              f"paths.run_dir={REPO_ROOT / 'outputs' / 'publish_run'}"])
    return settings_from_config(OmegaConf.to_container(config, resolve=True)).selection


def parent_run_tags(tracking_uri: str, experiment: str, run_dir: Path) -> dict:
    """The provenance tags of the MLflow parent run that started when ``run_dir`` was made."""
    try:
        started = int(datetime.strptime(run_dir.name, RUN_DIR_STAMP).timestamp() * 1000)
    except ValueError:
        raise SystemExit(f"{run_dir.name!r} is not a run directory's name (a local start time such as "
                         "2026-12-01_22-44-24): pass outputs/runs/<stamp>") from None
    client = mlflow.MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"no MLflow experiment {experiment!r} at {tracking_uri}")
    # Only runs that started near the directory's stamp: a store of many runs holds far more than one page.
    window = (f"attributes.start_time >= {started - 120_000} AND attributes.start_time <= {started + 120_000}")
    runs = [run for run in client.search_runs([found.experiment_id], filter_string=window, max_results=1000)
            if "mlflow.parentRunId" not in run.data.tags]
    if not runs:
        raise SystemExit(f"no parent runs in MLflow experiment {experiment!r}")
    run = min(runs, key=lambda r: abs(r.info.start_time - started))
    if abs(run.info.start_time - started) > 120_000:
        raise SystemExit(f"no MLflow parent run started within 2 minutes of {run_dir.name} in {experiment!r}")
    return {"mlflow_run_id": run.info.run_id, **{tag: run.data.tags.get(tag, "") for tag in PROVENANCE_TAGS}}


SUMMARY_COLUMNS = ("rtf_cpu_b1", "rtf_cuda_b1", "dnsmos_p808", "wer", "mcd_db", "spk_sim")


def summary_markdown(report: dict, baseline: str = "original_onnx") -> str:
    """One line per variant for docs/benchmarks.md: speed (with its spread over interleaved rounds and
    its speed-up over ``baseline`` from the same run), quality, and the verdict of each rule."""
    rows = report["rows"]
    rules = {"run's rule": report["selection"], **report["also_selected"]}
    header = ["variant", "rtf_cpu_b1 (spread)", f"x {baseline}", *SUMMARY_COLUMNS[1:], *rules]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    base = rows.get(baseline, {}).get("rtf_cpu_b1")
    for name, metrics in rows.items():
        rtf = metrics.get("rtf_cpu_b1")
        cells = [name, "-" if rtf is None else f"{rtf:.4g} ({metrics.get('rtf_cpu_b1_spread', 0.0):.2g})",
                 "-" if rtf is None or base is None else f"{base / rtf:.2f}"]
        cells += [f"{metrics[c]:.4g}" if c in metrics else "-" for c in SUMMARY_COLUMNS[1:]]
        for rule in rules.values():
            eligibility = rule["eligibility"].get(name, {"eligible": False, "reasons": ["not scored"]})
            verdict = "**champion**" if rule["champion"] == name else (
                "eligible" if eligibility["eligible"] else "; ".join(eligibility["reasons"]))
            cells.append(verdict)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m compress.publish_run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, type=Path, help="outputs/runs/<stamp> of a finished run")
    parser.add_argument("--out", required=True, help="the JSON to write, e.g. docs/results/full_<date>_<set>.json")
    parser.add_argument("--also-selection", action="append", default=[], metavar="NAME",
                        help="another rule of conf/selection/ to apply to the same rows (repeatable)")
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    origin = publication_or_exit(parser, REPO_ROOT, args.out, args.allow_dirty)
    missing = [name for name in ("results.json", "selection.json", "resolved_config.yaml")
               if not (args.run_dir / name).is_file()]
    if missing:
        parser.error(f"{args.run_dir} lacks {missing}: not a finished run of python -m compress")
    rows = json.loads((args.run_dir / "results.json").read_text(encoding="utf-8"))
    selection = json.loads((args.run_dir / "selection.json").read_text(encoding="utf-8"))
    resolved = yaml.safe_load((args.run_dir / "resolved_config.yaml").read_text(encoding="utf-8"))
    tracking = resolved["tracking"]
    run_origin = parent_run_tags(tracking["tracking_uri"], tracking["experiment_name"], args.run_dir)
    # Which rows a resumed run reused, and from when (compress/evaluation_cache.py); older runs lack the file.
    origins_path = args.run_dir / "evaluation_origins.json"
    if origins_path.is_file():
        run_origin["evaluation_origins"] = json.loads(origins_path.read_text(encoding="utf-8"))
    reference = resolved["evaluate"]["reference_variant"]
    others = {}
    unit = error_unit(scored_language(resolved["data"]["eval_set"], resolved["model"]["language"]))
    for name in args.also_selection:
        chosen = select_champion(rows, selection_settings(name).for_error_unit(unit), reference).to_json()
        others[name] = {key: value for key, value in chosen.items() if key != "rows"}
    report = {
        "what": f"python -m compress run {args.run_dir.name}: every variant scored on one evaluation set",
        "run": {"dir": str(args.run_dir), **run_origin, "eval_set": resolved["data"]["eval_set"],
                "max_eval_sentences": resolved["data"]["max_eval_sentences"],
                "variants": resolved["variants"], "evaluate": resolved["evaluate"]},
        "selection": {key: value for key, value in selection.items() if key != "rows"},
        "also_selected": others,
        "rows": rows,
        "provenance": origin,
    }
    write_text_atomic(Path(args.out), json.dumps(report, indent=1) + "\n")
    print(summary_markdown(report))
    print(f"wrote {args.out}: {len(rows)} variants; champion {selection['champion']}"
          + "".join(f"; by {name}: {chosen['champion']}" for name, chosen in others.items()))


if __name__ == "__main__":
    main()
