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

The deployed variant is the champion when serve can run it: from its ONNX graph
(``Variant.artifacts["onnx"]``), or rebuilt from the teacher by the recipe its stage built it with
(the teacher, fp16/bf16, int8_dynamic: export.manifest.REBUILT_VARIANTS; nothing is registered then,
as there is no graph). Otherwise it is the best-ranked eligible variant serve can run, and the
manifest says why.
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
from mlflow.exceptions import MlflowException

from core.atomic_io import atomic_write, write_text_atomic
from compress.selection import RegistrySettings, Selection, SelectionSettings, pareto_figure, select_champion
from compress.settings import RunSettings, TrackingSettings
from evaluate.asr import error_unit
from export.manifest import (
    GRAPH_ENGINE,
    REBUILD_ENGINE,
    REBUILT_VARIANTS,
    DeploymentManifest,
    load_manifest,
    rebuild_refusal,
    write_manifest,
)
from models.family import Family
from models.registry import get_family

GRAPH_ARTIFACT = "onnx"  # the Variant.artifacts key of a variant's ONNX graph (its family's graph contract)
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


@dataclass(frozen=True)
class Deployment:
    """The variant a run deploys, and how serve gets it."""

    variant: str
    why: str
    graph: Path | None  # its ONNX graph; None: serve rebuilds it from the teacher by its recipe


def deployable_choice(selection: Selection, variant_artifacts: dict[str, dict[str, Path]], family: Family) -> Deployment:
    """The champion if serve can run it (its ONNX graph, where the family has a runtime for graphs; or
    rebuilt from the teacher: export.manifest.REBUILT_VARIANTS), else the best-ranked eligible variant
    that serve can run."""
    if selection.champion is None:
        raise NoDeployableVariant(f"no eligible variant under the rule: {selection.rule}")

    def runnable_graph(name: str) -> Path | None:
        return _graph(variant_artifacts, name) if family.reference is not None else None

    def refusal(name: str) -> str | None:
        if runnable_graph(name) is not None:
            return None
        graph = ("it has no ONNX graph" if family.reference is not None else
                 "the family has no runtime for exported graphs (Family.reference)")
        rebuilt = rebuild_refusal(name)
        return None if rebuilt is None else f"{graph}, and it {rebuilt}"

    for rank, name in enumerate(selection.ranking):
        if refusal(name) is not None:
            continue
        graph = runnable_graph(name)
        how = "its ONNX graph" if graph is not None else "rebuilt from the teacher by its recipe"
        if name == selection.champion:
            objective = selection.objective_metric
            return Deployment(name, f"champion by the rule ({objective} {selection.rows[name][objective]:.4g}); "
                                    f"served as {how}", graph)
        return Deployment(name, (f"champion {selection.champion!r} cannot be served: {refusal(selection.champion)}; "
                                 f"{name!r} is the best-ranked eligible variant serve can run, as {how} "
                                 f"(ranked above it: {list(selection.ranking[:rank])})"), graph)
    raise NoDeployableVariant(
        f"serve can run no eligible variant: none has an ONNX graph (Variant.artifacts[{GRAPH_ARTIFACT!r}]) that "
        f"the family's runtime runs, or is one serve rebuilds from the teacher ({sorted(REBUILT_VARIANTS)}); "
        f"eligible, best first: {list(selection.ranking)}")


def rebuild_recipe(variant: str, stage_settings: object | None) -> dict[str, list[str]]:
    """The recipe serve rebuilds ``variant`` by: REBUILT_VARIANTS' fields, read off the settings of the
    stage that built it (``None`` for the teacher, which no stage builds)."""
    fields = REBUILT_VARIANTS[variant]
    missing = [name for name in fields if not hasattr(stage_settings, name)]
    if missing:
        raise ValueError(f"variant {variant!r}: its stage settings {stage_settings!r} lack recipe fields {missing}")
    return {name: list(getattr(stage_settings, name)) for name in fields}


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
                      voice: VoiceIdentity, family: Family, built_with: dict[str, object] | None = None) -> Path:
    """Write ``<output_dir>/<manifest_dir>/manifest.json`` for the deployed variant: beside its graph,
    which is registered in MLflow's model registry, or with the recipe serve rebuilds it by
    (``built_with``: variant -> the settings of the stage that built it; the teacher has none).

    Returns the manifest's path; raises NoDeployableVariant when serve can run no eligible variant.
    """
    deployment = deployable_choice(selection, variant_artifacts, family)
    deployed = deployment.variant
    folder = settings.champion_dir(output_dir, voice.family)
    selection_record = {"rule": selection.rule, "champion": selection.champion, "deployed": deployed,
                        "why": deployment.why, "objective_metric": selection.objective_metric,
                        "ranking": list(selection.ranking),
                        "ineligible": {n: list(e.reasons) for n, e in selection.eligibility.items() if not e.eligible}}
    if deployment.graph is None:
        files = {"engine": REBUILD_ENGINE, "recipe": rebuild_recipe(deployed, (built_with or {}).get(deployed))}
        keep = None
        _clear_alias(tracking, settings.registry, voice)
    else:
        graph_name = f"{deployed}.onnx"
        atomic_write(folder / graph_name, lambda tmp: shutil.copyfile(deployment.graph, tmp))
        selection_record.update(_register_graph(deployment, run_id, tracking, settings.registry, voice))
        files, keep = {"engine": GRAPH_ENGINE, "graph": graph_name}, graph_name

    manifest_path = folder / "manifest.json"
    write_manifest(manifest_path, DeploymentManifest(
        variant=deployed, family=voice.family, voice=voice.voice, sample_rate_hz=int(voice.sample_rate_hz),
        metrics=selection.rows[deployed], selection=selection_record, mlflow_run_id=run_id, **files))
    load_manifest(manifest_path)  # what serve will do: fail here, not at serving time
    for stale in folder.glob("*.onnx"):  # an earlier champion's graph: the manifest names only the new one
        if stale.name != keep:
            stale.unlink()
    MlflowClient(tracking.tracking_uri).log_artifact(run_id, str(manifest_path), "selection")
    return manifest_path


def _clear_alias(tracking: TrackingSettings, registry: RegistrySettings, voice: VoiceIdentity) -> None:
    """Take the champion alias off an earlier run's graph: this run's champion has none, and
    ``models:/<name>@champion`` would otherwise name a graph the manifest no longer deploys."""
    client = MlflowClient(tracking.tracking_uri)
    model_name = registry.model_name_for(voice.family, voice.voice)
    if not client.search_registered_models(filter_string=f"name = '{model_name}'"):
        return
    with contextlib.suppress(MlflowException):  # no version holds the alias
        client.delete_registered_model_alias(model_name, registry.alias)


def _register_graph(deployment: Deployment, run_id: str, tracking: TrackingSettings, registry: RegistrySettings,
                    voice: VoiceIdentity) -> dict[str, str]:
    """Log the deployed graph as an MLflow ONNX model, register it and point the alias at the new version."""
    mlflow.set_tracking_uri(tracking.tracking_uri)
    model_name = registry.model_name_for(voice.family, voice.voice)
    with _in_run(run_id):
        model_info = mlflow.onnx.log_model(
            onnx.load(str(deployment.graph)), name="champion", registered_model_name=model_name,
            save_as_external_data=False,  # one self-contained file, as serve and onnxruntime load it
            # What a graph needs is onnx and onnxruntime at these versions; stating them skips
            # MLflow's inference, which loads the model again in a subprocess (about 9 s a run).
            pip_requirements=mlflow.onnx.get_default_pip_requirements(),
            tags={"variant": deployment.variant},
        )
    version = str(model_info.registered_model_version)
    client = MlflowClient(tracking.tracking_uri)
    client.set_registered_model_alias(model_name, registry.alias, version)
    client.set_model_version_tag(model_name, version, "variant", deployment.variant)
    client.set_model_version_tag(model_name, version, "source_run_id", run_id)
    return {"registered_model": f"models:/{model_name}@{registry.alias}", "registered_model_version": version}


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
                        parent_run_id: str, built_with: dict[str, object] | None = None) -> str:
    """The pipeline's last step; returns a one-paragraph summary. ``variants``: {name: compress.variants.Variant};
    ``built_with``: variant -> the typed settings of the stage that built it (compress.stages.built_with).

    A run with no eligible variant, or none that serve can run, still finishes: the summary says why.
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
    family = get_family(settings.model.family)
    try:
        manifest_path = register_champion(selection, {n: v.artifacts for n, v in variants.items()}, parent_run_id,
                                          settings.tracking, Path(settings.paths.output_dir), rule,
                                          voice, family, built_with)
    except NoDeployableVariant as reason:
        lines.append(f"not deployed: {reason}")
    else:
        deployed = load_manifest(manifest_path)
        registered = (f"registered {deployed.selection['registered_model']} "
                      f"(version {deployed.selection['registered_model_version']})"
                      if "registered_model" in deployed.selection else
                      f"rebuilt by serve from the teacher ({deployed.recipe}); no graph to register")
        lines.append(f"deployed {deployed.variant!r}: {deployed.selection['why']}; manifest {manifest_path}; "
                     f"{registered}")
    return "\n".join(lines)
