"""The champion rule on hand-made rows, its config checks, the Pareto front, and the registry round trip."""
import json
from pathlib import Path

import mlflow
import numpy as np
import onnx
import onnxruntime
import pytest
import yaml
from onnx import TensorProto, helper

from compress.registration import (
    NoDeployableVariant,
    VoiceIdentity,
    deployable_choice,
    log_selection,
    register_champion,
)
from compress.selection import (
    Constraint,
    ObjectiveSettings,
    RegistrySettings,
    SelectionSettings,
    TieBreaker,
    pareto_figure,
    pareto_front,
    select_champion,
)
from core.config import ConfigError
from compress.int8_dynamic import Int8DynamicSettings
from compress.run_config import settings_from_config
from compress.settings import TrackingSettings
from export.manifest import load_manifest
from models.registry import get_family

REPO_ROOT = Path(__file__).resolve().parents[2]
PIPER = get_family("piper")


def rows_fixture() -> dict[str, dict[str, float]]:
    """Teacher reference plus four candidates, each failing or passing for one clear reason."""
    return {
        "teacher": {"rtf_cpu_b1": 0.080, "dnsmos_p808": 3.90, "wer": 0.010, "size_mb": 62.6},
        "original_onnx": {"rtf_cpu_b1": 0.060, "dnsmos_p808": 3.90, "wer": 0.010, "spk_sim": 1.00, "size_mb": 63.2},
        "int8_ort": {"rtf_cpu_b1": 0.050, "dnsmos_p808": 3.85, "wer": 0.020, "spk_sim": 0.97, "size_mb": 40.0},
        "pruned": {"rtf_cpu_b1": 0.030, "dnsmos_p808": 3.70, "wer": 0.015, "spk_sim": 0.95, "size_mb": 30.0},
        "fp16": {"dnsmos_p808": 3.90, "wer": 0.010, "spk_sim": 0.99, "size_mb": 31.3},  # no CPU timing
    }


def default_settings(**changes) -> SelectionSettings:
    return SelectionSettings(**changes)


def test_constraints_relative_to_the_reference_and_absolute():
    selection = select_champion(rows_fixture(), default_settings(), "teacher")
    reasons = {name: e.reasons for name, e in selection.eligibility.items()}
    # pruned is fastest but 0.2 MOS below the teacher: dnsmos_p808 >= 3.90 - 0.1 fails.
    assert reasons["pruned"] == ("dnsmos_p808 3.7 fails dnsmos_p808 >= teacher - 0.1 (= 3.8)",)
    assert reasons["int8_ort"] == () and reasons["original_onnx"] == ()
    # The teacher has spk_sim against itself from reference_self_scores (1.0), so it is eligible.
    assert reasons["teacher"] == ()
    assert selection.champion == "int8_ort"
    assert selection.objective_metric == "rtf_cpu_b1"  # no variant has rtf_cuda_b1: the configured fallback


def test_missing_constraint_metric_makes_a_variant_ineligible_with_that_reason():
    rows = rows_fixture()
    del rows["int8_ort"]["spk_sim"]
    rows["original_onnx"]["wer"] = float("nan")  # a metric that failed to compute counts as missing
    selection = select_champion(rows, default_settings(), "teacher")
    assert selection.eligibility["int8_ort"].reasons == ("no spk_sim",)
    assert selection.eligibility["original_onnx"].reasons == ("no wer",)
    assert selection.champion == "teacher"


def test_relative_constraint_without_the_reference_metric_names_the_reference():
    rows = rows_fixture()
    del rows["teacher"]["wer"]
    selection = select_champion(rows, default_settings(), "teacher")
    assert not any(e.eligible for e in selection.eligibility.values())
    assert "reference 'teacher' has no wer" in selection.eligibility["int8_ort"].reasons
    assert selection.champion is None and selection.ranking == ()
    with pytest.raises(NoDeployableVariant, match="no eligible variant"):
        deployable_choice(selection, {}, PIPER)


def test_bounds_are_inclusive():
    rows = rows_fixture()
    rows["int8_ort"]["dnsmos_p808"] = 3.80  # exactly teacher - 0.1
    rows["int8_ort"]["spk_sim"] = 0.90
    assert select_champion(rows, default_settings(), "teacher").champion == "int8_ort"


def test_objective_uses_the_first_metric_every_eligible_variant_has():
    rows = rows_fixture()
    for name, rtf in (("teacher", 0.008), ("original_onnx", 0.007), ("int8_ort", 0.009), ("fp16", 0.004)):
        rows[name]["rtf_cuda_b1"] = rtf
    selection = select_champion(rows, default_settings(), "teacher")
    assert selection.objective_metric == "rtf_cuda_b1"
    assert selection.ranking == ("fp16", "original_onnx", "teacher", "int8_ort")
    # CUDA figures for only two of the four eligible variants: all are ranked on the fallback, and
    # fp16 (no CPU timing) cannot be ranked with them: ineligible, with that reason.
    del rows["int8_ort"]["rtf_cuda_b1"], rows["original_onnx"]["rtf_cuda_b1"]
    selection = select_champion(rows, default_settings(), "teacher")
    assert selection.objective_metric == "rtf_cpu_b1"
    assert selection.eligibility["fp16"].reasons == ("no rtf_cpu_b1 (the objective)",)
    assert selection.champion == "int8_ort"
    # Equal coverage (each metric misses one variant): the earlier metric of the chain wins.
    rows["original_onnx"]["rtf_cuda_b1"] = 0.007
    selection = select_champion(rows, default_settings(), "teacher")
    assert selection.objective_metric == "rtf_cuda_b1"
    assert selection.eligibility["int8_ort"].reasons == ("no rtf_cuda_b1 (the objective)",)
    assert selection.champion == "fp16"


def test_no_objective_metric_at_all():
    rows = {name: {k: v for k, v in m.items() if not k.startswith("rtf")} for name, m in rows_fixture().items()}
    selection = select_champion(rows, default_settings(), "teacher")
    assert selection.champion is None and selection.objective_metric is None
    assert selection.eligibility["int8_ort"].reasons == ("no objective metric (any of ['rtf_cuda_b1', 'rtf_cpu_b1'])",)


def test_ties_go_to_the_tie_breaker_then_to_the_run_order():
    rows = rows_fixture()
    rows["original_onnx"]["rtf_cpu_b1"] = rows["int8_ort"]["rtf_cpu_b1"] = rows["teacher"]["rtf_cpu_b1"] = 0.05
    selection = select_champion(rows, default_settings(), "teacher")
    assert selection.ranking == ("int8_ort", "teacher", "original_onnx")  # size_mb 40 < 62.6 < 63.2
    largest_first = select_champion(rows, default_settings(tie_breakers=(TieBreaker("size_mb", "maximize"),)),
                                    "teacher")
    assert largest_first.ranking == ("original_onnx", "teacher", "int8_ort")
    no_tie_breakers = select_champion(rows, default_settings(tie_breakers=()), "teacher")
    assert no_tie_breakers.ranking == ("teacher", "original_onnx", "int8_ort")  # the rows' order
    del rows["int8_ort"]["size_mb"]  # lacking a tie-breaker ranks after those that have it
    assert select_champion(rows, default_settings(), "teacher").ranking[-1] == "int8_ort"


def test_maximize_direction_and_rule_text():
    settings = default_settings(objective=ObjectiveSettings("spk_sim", "maximize", ()),
                                constraints=(Constraint("wer", at_most=0.004, relative_to_reference=True),))
    selection = select_champion(rows_fixture(), settings, "teacher")
    assert selection.champion == "teacher"  # spk_sim 1.0 from reference_self_scores, listed first
    assert selection.ranking == ("teacher", "original_onnx", "fp16")
    assert selection.rule == ("eligible: wer <= teacher + 0.004. champion: maximize spk_sim; a lead within the "
                              "larger of two variants' spreads (_spread) is a tie. ties: minimize size_mb, then the "
                              "order the run scored them.")
    assert json.loads(json.dumps(selection.to_json()))["eligibility"]["int8_ort"]["eligible"] is False


def test_unknown_reference_is_an_error():
    with pytest.raises(ValueError, match="reference 'lite' is not among the rows"):
        select_champion(rows_fixture(), default_settings(), "lite")


@pytest.mark.parametrize(
    "override, message",
    [
        ("+selection.champion_metric=rtf", r"unknown keys \['champion_metric'\]"),
        ("selection.objective.direction=lowest", "selection.objective.direction='lowest'"),
        ("+selection.objective.order=1", r"selection.objective: unknown keys \['order'\]"),
        ("selection.objective.fallbacks=[rtf_cuda_b1]", "repeat a name"),
        ("selection.constraints=[{metric:wer,at_most:0.1,at_least:0}]", "exactly one of at_least, at_most"),
        ("selection.constraints=[{metric:wer,max:0.1}]", r"selection.constraints\[0\]: unknown keys \['max'\]"),
        ("selection.tie_breakers=[{metric:size_mb,direction:up}]", "tie_breakers\\[size_mb\\].direction='up'"),
        ("selection.manifest_dir=a/b", "one folder name"),
        ("selection.registry.alias=''", "alias must be non-empty"),
    ],
)
def test_bad_selection_config_stops_the_run_at_start(debug_config, override, message):
    with pytest.raises(ConfigError, match=message):
        settings_from_config(debug_config(override))


def test_dataclass_defaults_are_the_config_file(tmp_path):
    from tests.conftest import compose_config

    assert settings_from_config(compose_config(tmp_path, [])).selection == SelectionSettings()


def test_registered_name_is_derived_from_the_run_unless_the_config_gives_one(tmp_path):
    from tests.conftest import compose_config

    settings = settings_from_config(compose_config(tmp_path, []))
    registry = settings.selection.registry
    # The default run keeps the name the registry already holds versions under.
    assert registry.model_name_for(settings.model.family, settings.model.voice) == "tts-compress-piper-joe"
    assert registry.model_name_for("piper", "voices/en_US-amy-medium.onnx") == "tts-compress-piper-en-us-amy-medium"
    assert RegistrySettings(model_name="mine").model_name_for("piper", "bundled:joe") == "mine"


def test_pareto_front_minimize_x_maximize_y():
    rows = rows_fixture()
    # x rtf_cpu_b1 (lower better), y dnsmos_p808 (higher better); fp16 has no x: left out.
    assert pareto_front(rows, "rtf_cpu_b1", "dnsmos_p808") == ["pruned", "int8_ort", "original_onnx"]
    # teacher (0.08, 3.90) is dominated by original_onnx (0.06, 3.90): worse on x, equal on y.
    rows["teacher"]["rtf_cpu_b1"] = 0.06  # now equal on both: both on the front
    assert set(pareto_front(rows, "rtf_cpu_b1", "dnsmos_p808")) == {"pruned", "int8_ort", "original_onnx", "teacher"}
    assert pareto_front(rows, "rtf_cpu_b1", "dnsmos_p808", y_direction="minimize") == ["pruned"]
    with pytest.raises(ValueError, match="x_direction='down'"):
        pareto_front(rows, "rtf_cpu_b1", "dnsmos_p808", x_direction="down")


def test_pareto_figure_draws_every_point_front_and_champion(tmp_path):
    rows = rows_fixture()
    rows["int8_ort"]["vram_peak_mib"] = 100.0
    rows["pruned"]["vram_peak_mib"] = 300.0
    fig = pareto_figure(rows, x="rtf_cpu_b1", y="dnsmos_p808", size="vram_peak_mib", champion="int8_ort")
    ax = fig.axes[0]
    points = [c for c in ax.collections]
    assert len(points) == 4 + 1  # four variants with both metrics, plus the champion ring
    front_line = [line for line in ax.lines if line.get_label() == "Pareto front"][0]
    assert list(front_line.get_xdata()) == [0.03, 0.05, 0.06]
    areas = {round(float(c.get_offsets()[0][0]), 3): float(c.get_sizes()[0]) for c in points[:4]}
    assert areas[0.03] > areas[0.05] > areas[0.06]  # 300 MiB > 100 MiB > not measured (smallest)
    fig.savefig(tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").stat().st_size > 1000


def tiny_graph(path: Path, scale: float) -> Path:
    """y = x * scale: a real ONNX file that onnxruntime runs, small enough for a registry test."""
    node = helper.make_node("Mul", ["input", "scale"], ["output"])
    graph = helper.make_graph(
        [node], "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [None])],
        [helper.make_tensor("scale", TensorProto.FLOAT, [1], [scale])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_registry_round_trip_on_a_sqlite_store(tmp_path):
    """Register, then load `models:/<name>@champion`; the manifest loads as serve loads it."""
    tracking = TrackingSettings(f"sqlite:///{tmp_path / 'mlflow.db'}", "selection-test")
    mlflow.set_tracking_uri(tracking.tracking_uri)
    experiment_id = mlflow.create_experiment(tracking.experiment_name, artifact_location=(tmp_path / "art").as_uri())
    mlflow.set_experiment(experiment_id=experiment_id)  # nested runs go to the active experiment
    rows = rows_fixture()
    # teacher is torch-only; pruned (fastest) fails DNSMOS; int8_ort wins but has no graph in this run.
    artifacts = {"original_onnx": {"onnx": tiny_graph(tmp_path / "original.onnx", 2.0)},
                 "int8_ort": {"sensitivity_json": tmp_path / "s.json"}}
    selection = select_champion(rows, SelectionSettings(), "teacher")
    with mlflow.start_run(experiment_id=experiment_id) as parent:
        for name in rows:
            with mlflow.start_run(run_name=name, nested=True):
                mlflow.set_tag("variant", name)
        run_id = parent.info.run_id
        log_selection(selection, run_id, tracking.tracking_uri, tmp_path)
        manifest_path = register_champion(selection, artifacts, run_id, tracking, tmp_path / "outputs",
                                          SelectionSettings(), VoiceIdentity("piper", "bundled:joe", 22050), PIPER)

    manifest = load_manifest(manifest_path)
    assert manifest_path == tmp_path / "outputs" / "champion" / "piper" / "manifest.json"  # one folder per family
    assert manifest.variant == "original_onnx" and manifest.graph == "original_onnx.onnx"
    assert manifest.selection["champion"] == "int8_ort"
    assert "champion 'int8_ort' cannot be served: it has no ONNX graph" in manifest.selection["why"]
    assert manifest.engine == "onnxruntime" and manifest.recipe == {}
    assert manifest.selection["ineligible"] == {
        "pruned": ["dnsmos_p808 3.7 fails dnsmos_p808 >= teacher - 0.1 (= 3.8)"],
        "fp16": ["no rtf_cpu_b1 (the objective)"]}
    assert manifest.mlflow_run_id == run_id and manifest.metrics == rows["original_onnx"]

    loaded = mlflow.onnx.load_model("models:/tts-compress-piper-joe@champion")
    session = onnxruntime.InferenceSession(loaded.SerializeToString())
    output = session.run(None, {"input": np.array([1.5, -1.0], dtype=np.float32)})[0]
    np.testing.assert_allclose(output, [3.0, -2.0])  # the original_onnx graph (scale 2), not another

    client = mlflow.MlflowClient(tracking.tracking_uri)
    version = client.get_model_version_by_alias("tts-compress-piper-joe", "champion")
    assert version.tags["variant"] == "original_onnx" and version.tags["source_run_id"] == run_id
    children = client.search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'")
    eligible = {r.data.tags["variant"]: r.data.tags["selection_eligible"] for r in children}
    assert eligible == {"teacher": "true", "original_onnx": "true", "int8_ort": "true", "pruned": "false",
                        "fp16": "false"}  # fp16 has no CPU timing, the objective all eligible variants share
    logged = {a.path for a in client.list_artifacts(run_id, "selection")}
    assert {"selection/selection.json", "selection/pareto.png", "selection/manifest.json"} <= logged
    assert json.loads((tmp_path / "selection.json").read_text())["champion"] == "int8_ort"

    # A second registration moves the alias to a new version.
    artifacts["int8_ort"]["onnx"] = tiny_graph(tmp_path / "int8.onnx", 3.0)
    with mlflow.start_run(experiment_id=experiment_id) as parent:
        register_champion(selection, artifacts, parent.info.run_id, tracking, tmp_path / "outputs",
                          SelectionSettings(), VoiceIdentity("piper", "bundled:joe", 22050), PIPER)
    assert client.get_model_version_by_alias("tts-compress-piper-joe", "champion").version == 2
    champion_dir = tmp_path / "outputs" / "champion" / "piper"
    assert sorted(p.name for p in champion_dir.iterdir()) == ["int8_ort.onnx", "manifest.json"]
    reloaded = mlflow.onnx.load_model("models:/tts-compress-piper-joe@champion")
    session = onnxruntime.InferenceSession(reloaded.SerializeToString())
    np.testing.assert_allclose(session.run(None, {"input": np.array([1.0], dtype=np.float32)})[0], [3.0])


def test_no_servable_variant_is_reported_not_registered():
    rows = rows_fixture()
    del rows["teacher"]["rtf_cpu_b1"]  # the teacher, which serve could rebuild, drops out of the ranking
    selection = select_champion(rows, SelectionSettings(), "teacher")
    expected = r"serve can run no eligible variant: .*\['int8_ort', 'original_onnx'\]"
    with pytest.raises(NoDeployableVariant, match=expected):
        deployable_choice(selection, {"original_onnx": {"onnx": Path("/nonexistent.onnx")}}, PIPER)


def test_a_variant_without_a_graph_is_deployed_by_the_recipe_serve_rebuilds_it_with(tmp_path):
    """EmotiVoice has no runtime for exported graphs: its champion is rebuilt from the teacher, even
    where the pipeline exported the champion's graph. GPT-SoVITS's int8_dynamic is rebuilt too: its
    token-step engine runs the converted layers' int8 products."""
    rows = {"teacher": {"rtf_cpu_b1": 0.33, "dnsmos_p808": 2.2, "wer": 1.0, "size_mb": 600.0},
            "int8_dynamic": {"rtf_cpu_b1": 0.30, "dnsmos_p808": 2.2, "wer": 1.0, "spk_sim": 1.0, "size_mb": 500.0}}
    selection = select_champion(rows, SelectionSettings(), "teacher")
    assert selection.ranking == ("int8_dynamic", "teacher")
    graph = tiny_graph(tmp_path / "int8_dynamic.onnx", 2.0)
    deployment = deployable_choice(selection, {"int8_dynamic": {"onnx": graph}}, get_family("emotivoice"))
    assert (deployment.variant, deployment.graph) == ("int8_dynamic", None)
    assert "rebuilt from the teacher by its recipe" in deployment.why
    deployment = deployable_choice(selection, {}, get_family("gpt_sovits_v2"))
    assert (deployment.variant, deployment.graph) == ("int8_dynamic", None)
    assert "rebuilt from the teacher by its recipe" in deployment.why

    tracking = TrackingSettings(f"sqlite:///{tmp_path / 'mlflow.db'}", "rebuilt-test")
    mlflow.set_tracking_uri(tracking.tracking_uri)
    experiment_id = mlflow.create_experiment(tracking.experiment_name, artifact_location=(tmp_path / "art").as_uri())
    folder = tmp_path / "outputs" / "champion" / "emotivoice"
    folder.mkdir(parents=True)
    (folder / "teacher.onnx").write_bytes(b"an earlier champion's graph")
    built_with = {"int8_dynamic": Int8DynamicSettings(parts=["style_encoder"], keep_float=["*.pooler.*"])}
    with mlflow.start_run(experiment_id=experiment_id) as parent:
        manifest_path = register_champion(selection, {}, parent.info.run_id, tracking, tmp_path / "outputs",
                                          SelectionSettings(), VoiceIdentity("emotivoice", "random", 16000),
                                          get_family("emotivoice"), built_with)
    manifest = load_manifest(manifest_path)
    assert (manifest.variant, manifest.engine, manifest.graphs) == ("int8_dynamic", "torch", {})
    assert manifest.recipe == {"parts": ["style_encoder"], "keep_float": ["*.pooler.*"]}
    assert "registered_model" not in manifest.selection  # no graph, nothing in the model registry
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"]  # the stale graph is gone
    assert mlflow.MlflowClient(tracking.tracking_uri).search_registered_models() == []


def test_cpu_selection_preset_ranks_on_the_cpu_rtf_only(debug_config):
    """selection=cpu: the run's own figures (docs/results/full_2026-11-30_harvard50.json) pick the CPU champion."""
    settings = settings_from_config(debug_config("selection=cpu"))
    assert (settings.selection.objective.metric, tuple(settings.selection.objective.fallbacks)) == ("rtf_cpu_b1", ())
    rows = json.loads((Path(__file__).resolve().parent.parent.parent / "docs/results/full_2026-11-30_harvard50.json").read_text())
    selection = select_champion(rows, settings.selection, "teacher")
    # GPU-only variants drop out for want of a CPU figure; the Lite variants fail DNSMOS and MCD.
    assert selection.champion == "int8_ort"
    assert selection.ranking == ("int8_ort", "original_onnx", "teacher")
    # The preset's own bar (the debug preset above replaces its constraints): a Lite student as good as
    # the teacher on DNSMOS still needs MCD <= 1.0 dB, and the pruned voice spk_sim >= 0.95.
    preset = yaml.safe_load((REPO_ROOT / "conf/selection/cpu.yaml").read_text())
    cpu_rule = SelectionSettings(objective=preset["objective"], constraints=preset["constraints"])
    rows["lite_int8"]["dnsmos_p808"] = rows["pruned"]["dnsmos_p808"] = rows["teacher"]["dnsmos_p808"]
    selection = select_champion(rows, cpu_rule, "teacher")
    assert selection.champion == "int8_ort"
    assert "mcd_db 1.172 fails" in " ".join(selection.eligibility["lite_int8"].reasons)
    assert "spk_sim 0.8533 fails spk_sim >= 0.95" in " ".join(selection.eligibility["pruned"].reasons)


def test_a_graph_outside_its_parity_budget_or_changed_durations_is_ineligible_where_measured():
    rows = {
        "teacher": {"rtf_cpu_b1": 0.080, "dnsmos_p808": 3.90, "wer": 0.01, "size_mb": 62.6},
        "fp16": {"rtf_cpu_b1": 0.050, "dnsmos_p808": 3.90, "wer": 0.01, "spk_sim": 1.0, "size_mb": 45.1,
                 "parity_within_budget": 0.0, "calib_durations_changed_fraction": 0.0},
        "bf16": {"rtf_cpu_b1": 0.055, "dnsmos_p808": 3.90, "wer": 0.01, "spk_sim": 1.0, "size_mb": 45.1,
                 "parity_within_budget": 1.0, "calib_durations_changed_fraction": 0.25},
        "int8_ort": {"rtf_cpu_b1": 0.060, "dnsmos_p808": 3.90, "wer": 0.01, "spk_sim": 1.0, "size_mb": 39.8},  # no such checks
    }
    selection = select_champion(rows, SelectionSettings(), reference_name="teacher")
    assert selection.champion == "int8_ort"
    reasons = {name: " ".join(verdict.reasons) for name, verdict in selection.eligibility.items()}
    assert "parity_within_budget 0 fails parity_within_budget >= 1 where measured" in reasons["fp16"]
    assert "calib_durations_changed_fraction 0.25 fails" in reasons["bf16"]
    assert reasons["int8_ort"] == ""


def test_a_lead_within_the_spread_is_a_tie_that_the_smaller_variant_wins():
    rows = {
        "teacher": {"rtf_cpu_b1": 0.080, "rtf_cpu_b1_spread": 0.004, "dnsmos_p808": 3.90, "wer": 0.01, "size_mb": 62.6},
        "fp32_graph": {"rtf_cpu_b1": 0.0600, "rtf_cpu_b1_spread": 0.003, "dnsmos_p808": 3.90, "wer": 0.01,
                       "spk_sim": 1.0, "size_mb": 63.2},
        "int8": {"rtf_cpu_b1": 0.0585, "rtf_cpu_b1_spread": 0.002, "dnsmos_p808": 3.90, "wer": 0.01,
                 "spk_sim": 1.0, "size_mb": 39.8},
    }
    # fp32_graph is 0.0015 behind int8 with spreads of 0.003 and 0.002: a tie, and int8 is smaller.
    assert select_champion(rows, SelectionSettings(), "teacher").ranking == ("int8", "fp32_graph", "teacher")
    rows["fp32_graph"]["size_mb"] = 30.0  # now the tie goes to fp32_graph, although it is slower
    assert select_champion(rows, SelectionSettings(), "teacher").ranking[0] == "fp32_graph"
    for name in rows:  # measured once (no spreads): the faster one wins by any margin
        rows[name].pop("rtf_cpu_b1_spread")
    assert select_champion(rows, SelectionSettings(), "teacher").ranking[0] == "int8"


def test_a_voice_is_held_to_the_error_rate_its_language_is_scored_in():
    """A Mandarin run measures CER, never WER: the default rule found every variant ineligible
    ("no wer"); fitted to the character unit it ranks them, and a CER regression still fails."""
    rows = {name: {("cer" if key == "wer" else key): value for key, value in row.items()}
            for name, row in rows_fixture().items()}
    assert select_champion(rows, default_settings(), "teacher").champion is None  # every variant: "no wer"
    by_character = default_settings().for_error_unit("char")
    assert [c.metric for c in by_character.constraints if c.metric in ("wer", "cer")] == ["cer"]
    selection = select_champion(rows, by_character, "teacher")
    assert selection.champion == "int8_ort"  # as for the same rows scored in WER
    rows["int8_ort"]["cer"] = 0.05
    assert select_champion(rows, by_character, "teacher").eligibility["int8_ort"].reasons == (
        "cer 0.05 fails cer <= teacher + 0.02 (= 0.03)",)
    del rows["int8_ort"]["cer"]  # measured for its unit, the rate binds: a variant without it fails
    assert select_champion(rows, by_character, "teacher").eligibility["int8_ort"].reasons == ("no cer",)
    by_word = default_settings().for_error_unit("word")
    assert [c.metric for c in by_word.constraints if c.metric in ("wer", "cer")] == ["wer"]
    with pytest.raises(ValueError, match="error unit"):
        default_settings().for_error_unit("phoneme")


def test_a_rebuilt_champion_takes_the_alias_off_the_earlier_graph(tmp_path):
    """models:/<name>@champion must not name a graph the manifest no longer deploys."""
    tracking = TrackingSettings(f"sqlite:///{tmp_path / 'mlflow.db'}", "alias-test")
    mlflow.set_tracking_uri(tracking.tracking_uri)
    experiment_id = mlflow.create_experiment(tracking.experiment_name, artifact_location=(tmp_path / "art").as_uri())
    voice = VoiceIdentity("piper", "bundled:joe", 22050)
    rows = rows_fixture()
    with_graph = select_champion(rows, SelectionSettings(), "teacher")  # int8_ort
    with mlflow.start_run(experiment_id=experiment_id) as parent:
        register_champion(with_graph, {"int8_ort": {"onnx": tiny_graph(tmp_path / "int8.onnx", 3.0)}},
                          parent.info.run_id, tracking, tmp_path / "outputs", SelectionSettings(), voice, PIPER)
    client = mlflow.MlflowClient(tracking.tracking_uri)
    assert client.get_model_version_by_alias("tts-compress-piper-joe", "champion").tags["variant"] == "int8_ort"

    rows["teacher"]["rtf_cpu_b1"] = 0.01  # now the teacher wins, and this run exported no graph of it
    rebuilt = select_champion(rows, SelectionSettings(), "teacher")
    with mlflow.start_run(experiment_id=experiment_id) as parent:
        manifest_path = register_champion(rebuilt, {}, parent.info.run_id, tracking, tmp_path / "outputs",
                                          SelectionSettings(), voice, PIPER)
    assert (load_manifest(manifest_path).variant, load_manifest(manifest_path).engine) == ("teacher", "torch")
    with pytest.raises(mlflow.exceptions.MlflowException):
        client.get_model_version_by_alias("tts-compress-piper-joe", "champion")
    assert len(client.search_model_versions("name = 'tts-compress-piper-joe'")) == 1  # the version itself stays
