"""A family's stage defaults (conf/stages/family/<family>.yaml, brought by its model config) win over
the generic conf/stages/default.yaml, and lose to an experiment and to the command line.

    python -m pytest -q tests/compress/test_family_stage_defaults.py
"""
from __future__ import annotations

import pytest
import yaml
from conftest import REPO_ROOT, compose_config

from compress.run_config import settings_from_config

CONF = REPO_ROOT / "conf"


def _leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    """``{"distil.lr": 3e-4, ...}`` of a nested mapping (a dict value that is empty counts as a leaf)."""
    leaves = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            leaves.update(_leaves(value, f"{prefix}{key}."))
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves


def _family_stage_file(model_config: str) -> str:
    """The conf/stages/family option a model config's defaults list names."""
    defaults = yaml.safe_load((CONF / "model" / f"{model_config}.yaml").read_text())["defaults"]
    (choice,) = [entry["/stages/family"] for entry in defaults if isinstance(entry, dict) and "/stages/family" in entry]
    return choice


def _lookup(config: dict, dotted: str) -> object:
    for key in dotted.split("."):
        config = config[key]
    return config


@pytest.mark.parametrize("model_config", sorted(path.stem for path in (CONF / "model").glob("*.yaml")))
def test_every_family_stage_default_survives_composition(tmp_path, model_config):
    family_file = CONF / "stages" / "family" / f"{_family_stage_file(model_config)}.yaml"
    declared = _leaves(yaml.safe_load(family_file.read_text()) or {})
    stages = compose_config(tmp_path, [f"model={model_config}"])["stages"]
    masked = {key: (value, _lookup(stages, key)) for key, value in declared.items() if _lookup(stages, key) != value}
    assert not masked, f"{family_file.name}: (declared, composed) of keys the generic defaults replaced: {masked}"


def test_emotivoice_value_wins_over_generic_and_loses_to_command_line(tmp_path):
    generic = yaml.safe_load((CONF / "stages" / "default.yaml").read_text())["distil"]
    family = compose_config(tmp_path, ["model=emotivoice"])["stages"]["distil"]
    assert (generic["latent_weight"], family["latent_weight"]) == (1.0, 0.0)  # conf/stages/family/emotivoice.yaml
    assert family["lr"] == generic["lr"]  # a key the family leaves alone keeps the generic value
    assert family["student"] == {"upsample_initial_channel": 128}
    overridden = compose_config(tmp_path, ["model=emotivoice", "stages.distil.latent_weight=0.5",
                                           "stages.distil.student.upsample_initial_channel=64"])["stages"]["distil"]
    assert (overridden["latent_weight"], overridden["student"]) == (0.5, {"upsample_initial_channel": 64})


def test_gpt_sovits_distil_recipe_reaches_typed_settings_and_experiment_still_wins(tmp_path):
    """GPT-SoVITS declares its Lite transformer's recipe (lr 3e-4, 2000 steps): before the fix the
    generic lr 1e-3 and train_steps 0 replaced it silently."""
    plain = settings_from_config(compose_config(tmp_path, ["model=gpt_sovits_v2", "variants=[teacher,lite]"]))
    distil = plain.stages["distil"]
    assert (distil.lr, distil.train_steps, distil.warmup_steps, distil.batch_size) == (3e-4, 2000, 100, 8)
    debug = compose_config(tmp_path, ["model=gpt_sovits_v2", "+experiment=debug_gpt_sovits"])["stages"]["distil"]
    assert (debug["train_steps"], debug["lr"]) == (6, 3e-4)  # the experiment's steps, the family's lr
    cli = compose_config(tmp_path, ["model=gpt_sovits_v2", "+experiment=debug_gpt_sovits", "stages.distil.lr=0.01"])
    assert cli["stages"]["distil"]["lr"] == 0.01
