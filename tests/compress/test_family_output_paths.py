"""Runs of two families share ``paths.output_dir`` without overwriting each other: stage outputs
(``stages/<family>/<variant>``), exported graphs (``graphs/<family>/<variant>``) and the champion
(``<selection.manifest_dir>/<family>``) are kept per family, a rerun still resumes from its own
finished stage, and `python -m serve` reads the champion of the family it is configured for.

    python -m pytest -q tests/compress/test_family_output_paths.py            # the layout, seconds
    python -m pytest -q tests/compress/test_family_output_paths.py -m slow    # two debug runs, about two minutes
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from compress.pipeline import run
from compress.run_config import settings_from_config
from compress.stage_cache import graph_dir, stage_dir
from models.registry import FAMILIES
from serve.engines import load_served_model
from serve.settings import serve_settings_from_config
from tests.conftest import compose_config

TABLE = "fp16_part_sensitivity.json"  # the fp16 stage's resumable table: the same file name in every family
# Fast debug runs: one sentence, no quality measure, timed once; every variant eligible, so the
# selection deploys the best-ranked one with a graph.
SHRINK = ["data.max_eval_sentences=1", "evaluate.metrics=[]", "evaluate.speed_rounds=0",
          "stages.fp16.measure_sentences=1", "selection.constraints=[]", "export.enabled=false"]
PIPER_RUN = ["+experiment=debug", "variants=[original_onnx,teacher,fp16]", *SHRINK]
# EmotiVoice on its tiny random weights (the run's teacher loader swapped below): the family's own
# folders and part roles, in seconds. (Kokoro's fp16 stage cannot run on CPU: oneDNN has no
# half-precision LSTM.)
EMOTIVOICE_RUN = ["model=emotivoice", "+debug=default", "variants=[teacher,fp16]", *SHRINK]


def test_stage_graph_and_champion_folders_are_keyed_by_family(tmp_path):
    for model, family in (("piper_joe", "piper"), ("kokoro_ja", "kokoro"), ("emotivoice", "emotivoice")):
        resolved = compose_config(tmp_path, [f"model={model}"])
        settings = settings_from_config(resolved)
        output_dir = Path(settings.paths.output_dir)
        assert stage_dir(output_dir, family, "fp16") == output_dir / "stages" / family / "fp16"
        assert graph_dir(output_dir, family, "teacher") == output_dir / "graphs" / family / "teacher"
        champion = settings.selection.champion_dir(output_dir, family)
        assert champion == output_dir / "champion" / family
        # What `python -m serve` reads from the same composed config.
        assert Path(serve_settings_from_config(resolved).manifest_path) == champion / "manifest.json"


def _table(output_dir: Path, family: str) -> dict:
    return json.loads((stage_dir(output_dir, family, "fp16") / TABLE).read_text(encoding="utf-8"))


@pytest.mark.slow
def test_two_families_keep_their_own_stage_outputs_and_champions(tmp_path, monkeypatch):
    emotivoice = FAMILIES["emotivoice"]
    monkeypatch.setitem(FAMILIES, "emotivoice", dataclasses.replace(
        emotivoice, load_teacher=lambda voice, cache_dir: emotivoice.tiny_model(0)))
    piper = compose_config(tmp_path, PIPER_RUN)
    run(settings_from_config(piper), piper)
    output_dir = Path(settings_from_config(piper).paths.output_dir)
    piper_table = _table(output_dir, "piper")
    other = compose_config(tmp_path, EMOTIVOICE_RUN)
    run(settings_from_config(other), other)

    other_table = _table(output_dir, "emotivoice")
    assert [row["part"] for row in piper_table["parts"]] == list(FAMILIES["piper"].part_roles)
    assert [row["part"] for row in other_table["parts"]] == list(emotivoice.part_roles)
    assert _table(output_dir, "piper") == piper_table  # the EmotiVoice run left Piper's stage output alone
    assert sorted(p.name for p in (output_dir / "stages").iterdir()) == ["emotivoice", "piper"]
    assert sorted(p.name for p in (output_dir / "graphs").iterdir()) == ["emotivoice", "piper"]

    # A rerun of Piper resumes from its finished table (measured once: the same measure time).
    rows = run(settings_from_config(piper), piper)
    assert rows["fp16"]["sensitivity_measure_s"] == piper_table["measure_s"]
    assert _table(output_dir, "piper") == piper_table

    # Each family's champion is in its own folder: EmotiVoice's, with no graph runtime, as the recipe
    # that rebuilds it from the teacher (the teacher: its fp16 has no CPU time to rank on).
    manifest = output_dir / "champion" / "piper" / "manifest.json"
    assert json.loads(manifest.read_text(encoding="utf-8"))["family"] == "piper"
    emotivoice_manifest = output_dir / "champion" / "emotivoice" / "manifest.json"
    deployed = json.loads(emotivoice_manifest.read_text(encoding="utf-8"))
    assert (deployed["family"], deployed["variant"], deployed["engine"], deployed["graphs"]) == (
        "emotivoice", "teacher", "torch", {})
    assert sorted(p.name for p in emotivoice_manifest.parent.iterdir()) == ["manifest.json"]
    served = load_served_model(serve_settings_from_config(compose_config(tmp_path, PIPER_RUN)))
    assert served.family.name == "piper" and served.note == f"champion from {manifest}"
    # Configured for EmotiVoice, the server takes EmotiVoice's champion, not Piper's.
    served = load_served_model(serve_settings_from_config(compose_config(tmp_path, EMOTIVOICE_RUN)))
    assert served.family.name == "emotivoice" and served.model_id == "teacher"
    assert served.note.startswith(f"champion from {emotivoice_manifest}, rebuilt from the teacher")
