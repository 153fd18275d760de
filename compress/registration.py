"""Log a run's selection to MLflow and register the champion's ONNX graph for serving.

``compress/pipeline.py`` calls ``select_and_register`` at the end of ``run()``, inside
the parent MLflow run (``python -m compress +experiment=full``). It

- tags every variant run ``selection_eligible`` (true/false) and ``selection_reasons``, and logs
  ``selection/selection.json`` and ``selection/pareto.png`` to the parent run (and the run folder);
- copies the deployed variant's graph to ``<paths.output_dir>/<selection.manifest_dir>/`` beside a
  ``manifest.json`` (export/manifest.py), which is what ``python -m serve`` loads;
- logs that graph as an MLflow ONNX model, registers it as ``selection.registry.model_name`` (by
  default tts-compress-<family>-<voice name>, ``RegistrySettings.model_name_for``) and points the
  alias ``champion`` at the new version: ``mlflow.onnx.load_model("models:/<name>@champion")``.

The deployed variant is the champion when it has an ONNX graph (``Variant.artifacts["onnx"]``);
otherwise the best-ranked eligible variant that has one, and the manifest says why.
"""
from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import mlflow
import onnx
from mlflow import MlflowClient

from core.atomic_io import atomic_write, write_text_atomic
from compress.selection import Selection, SelectionSettings, pareto_figure, select_champion
from compress.settings import RunSettings, TrackingSettings
from evaluate.asr import error_unit
from export.manifest import DeploymentManifest, load_manifest, write_manifest

GRAPH_ARTIFACT = "onnx"  # the Variant.artifacts key of a variant's ONNX graph (its family's graph contract)
MANIFEST_ENGINE = "onnxruntime"  # what serve runs a manifest's graph with (export.manifest.KNOWN_ENGINES)
PARETO_Y = "dnsmos_p808"  # quality axis of the logged Pareto plot: the MOS proxy the constraints guard
PARETO_SIZE = "vram_peak_mib"  # marker area; present when GPU figures are merged in


class NoDeployableVariant(RuntimeError):
    """No eligible variant has an ONNX graph: nothing can be registered or served."""


@dataclass(frozen=True)
class VoiceIdentity:
    """What the manifest says about the voice besides the graph (shared by every variant of a run)."""

    family: str  # export.manifest.KNOWN_FAMILIES
    voice: str  # "bundled:joe" or a voice path
    sample_rate_hz: int


def deployable_choice(selection: Selection, variant_artifacts: dict[str, dict[str, Path]]) -> tuple[str, str]:
    """(variant to deploy, why): the champion if it has a graph, else the best-ranked eligible one that has."""
    if selection.champion is None:
        raise NoDeployableVariant(f"no eligible variant under the rule: {selection.rule}")
    with_graph = [name for name in selection.ranking if _graph(variant_artifacts, name) is not None]
    if not with_graph:
        raise NoDeployableVariant(
            f"no eligible variant has an ONNX graph (Variant.artifacts[{GRAPH_ARTIFACT!r}]); eligible, best first: "
            f"{list(selection.ranking)}")
    deployed = with_graph[0]
    if deployed == selection.champion:
        objective = selection.objective_metric
        return deployed, f"champion by the rule ({objective} {selection.rows[deployed][objective]:.4g})"
    skipped = selection.ranking[: selection.ranking.index(deployed)]
    return deployed, (f"champion {selection.champion!r} has no ONNX graph and the manifest's engine is "
                      f"{MANIFEST_ENGINE}; {deployed!r} is the best-ranked eligible variant with one "
                      f"(ranked above it without a graph: {list(skipped)})")


def _graph(variant_artifacts: dict[str, dict[str, Path]], name: str) -> Path | None:
    path = variant_artifacts.get(name, {}).get(GRAPH_ARTIFACT)
    return Path(path) if path is not None and Path(path).is_file() else None


@contextlib.contextmanager
def _in_run(run_id: str):
    """Log into ``run_id``: the active run when it is that one (the pipeline's parent), else resume it."""
    active = mlflow.active_run()
    if active is not None and active.info.run_id == run_id:
        yield active
        return
    with mlflow.start_run(run_id=run_id, nested=active is not None) as run:
        yield run


def register_champion(selection: Selection, variant_artifacts: dict[str, dict[str, Path]], run_id: str,
                      tracking: TrackingSettings, output_dir: Path, settings: SelectionSettings,
                      voice: VoiceIdentity) -> Path:
    """Write ``<output_dir>/<manifest_dir>/manifest.json`` beside the deployed graph and register the graph.

    Returns the manifest's path; raises NoDeployableVariant when no eligible variant has an ONNX graph.
    """
    deployed, why = deployable_choice(selection, variant_artifacts)
    source_graph = _graph(variant_artifacts, deployed)
    folder = settings.champion_dir(output_dir, voice.family)
    graph_name = f"{deployed}.onnx"
    atomic_write(folder / graph_name, lambda tmp: shutil.copyfile(source_graph, tmp))
    for stale in folder.glob("*.onnx"):  # an earlier champion's graph: the manifest names only the new one
        if stale.name != graph_name:
            stale.unlink()

    mlflow.set_tracking_uri(tracking.tracking_uri)
    registry = settings.registry
    model_name = registry.model_name_for(voice.family, voice.voice)
    with _in_run(run_id):
        model_info = mlflow.onnx.log_model(
            onnx.load(str(source_graph)), name="champion", registered_model_name=model_name,
            save_as_external_data=False,  # one self-contained file, as serve and onnxruntime load it
            # What a graph needs is onnx and onnxruntime at these versions; stating them skips
            # MLflow's inference, which loads the model again in a subprocess (about 9 s a run).
            pip_requirements=mlflow.onnx.get_default_pip_requirements(),
            tags={"variant": deployed},
        )
    version = str(model_info.registered_model_version)
    client = MlflowClient(tracking.tracking_uri)
    client.set_registered_model_alias(model_name, registry.alias, version)
    client.set_model_version_tag(model_name, version, "variant", deployed)
    client.set_model_version_tag(model_name, version, "source_run_id", run_id)

    manifest_path = folder / "manifest.json"
    write_manifest(manifest_path, DeploymentManifest(
        variant=deployed, engine=MANIFEST_ENGINE, family=voice.family, voice=voice.voice, graph=graph_name,
        sample_rate_hz=int(voice.sample_rate_hz), metrics=selection.rows[deployed],
        selection={"rule": selection.rule, "champion": selection.champion, "deployed": deployed, "why": why,
                   "objective_metric": selection.objective_metric, "ranking": list(selection.ranking),
                   "ineligible": {n: list(e.reasons) for n, e in selection.eligibility.items() if not e.eligible},
                   "registered_model": f"models:/{model_name}@{registry.alias}",
                   "registered_model_version": version},
        mlflow_run_id=run_id,
    ))
    load_manifest(manifest_path)  # what serve will do: fail here, not at serving time
    client.log_artifact(run_id, str(manifest_path), "selection")
    return manifest_path


def log_selection(selection: Selection, parent_run_id: str, tracking_uri: str, run_dir: Path | None = None) -> None:
    """Tag each variant run of ``parent_run_id`` with its eligibility; log selection.json and pareto.png."""
    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'")
    for child in children:
        eligibility = selection.eligibility.get(child.data.tags.get("variant", ""))
        if eligibility is None:
            continue
        client.set_tag(child.info.run_id, "selection_eligible", str(eligibility.eligible).lower())
        client.set_tag(child.info.run_id, "selection_reasons", "; ".join(eligibility.reasons) or "eligible")
    client.set_tag(parent_run_id, "selection_champion", selection.champion or "none")
    text = json.dumps(selection.to_json(), indent=2)
    client.log_text(parent_run_id, text, "selection/selection.json")
    figure = pareto_figure(selection.rows, x=selection.objective_metric or "rtf_cpu_b1", y=PARETO_Y,
                           size=PARETO_SIZE, champion=selection.champion)
    client.log_figure(parent_run_id, figure, "selection/pareto.png")
    if run_dir is not None:
        write_text_atomic(Path(run_dir) / "selection.json", text)
        figure.savefig(Path(run_dir) / "pareto.png", dpi=100)


def select_and_register(rows: dict[str, dict[str, float]], variants: dict, settings: RunSettings,
                        parent_run_id: str) -> str:
    """The pipeline's last step; returns a one-paragraph summary. ``variants``: {name: compress.variants.Variant}.

    A run with no eligible variant, or none with a graph, still finishes: the summary says why.
    """
    rule = settings.selection.for_error_unit(error_unit(settings.scored_language))
    selection = select_champion(rows, rule, settings.evaluate.reference_variant)
    log_selection(selection, parent_run_id, settings.tracking.tracking_uri, Path(settings.paths.run_dir))
    ineligible = "; ".join(f"{n}: {', '.join(e.reasons)}" for n, e in selection.eligibility.items() if not e.eligible)
    lines = [f"selection rule: {selection.rule}",
             f"champion: {selection.champion or 'none'} (ranked on {selection.objective_metric})"]
    if ineligible:
        lines.append(f"ineligible: {ineligible}")
    reference_model = variants[settings.evaluate.reference_variant].model
    voice = VoiceIdentity(settings.model.family, settings.model.voice, reference_model.sample_rate_hz)
    try:
        manifest_path = register_champion(selection, {n: v.artifacts for n, v in variants.items()}, parent_run_id,
                                          settings.tracking, Path(settings.paths.output_dir), rule,
                                          voice)
    except NoDeployableVariant as reason:
        lines.append(f"not registered: {reason}")
    else:
        deployed = load_manifest(manifest_path)
        lines.append(f"deployed {deployed.variant!r}: {deployed.selection['why']}; manifest {manifest_path}; "
                     f"registered {deployed.selection['registered_model']} "
                     f"(version {deployed.selection['registered_model_version']})")
    return "\n".join(lines)
