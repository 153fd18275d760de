"""The GPT-SoVITS v2 text-to-semantic model against the official code's outputs, its loaders, and
reproducible sampling.

    python -m pytest -q tests/models/gpt_sovits/test_t2s.py
"""
from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from models.gpt_sovits.fixture_checks_t2s import t2s_checks
from models.gpt_sovits.t2s_checkpoint import (
    T2SCheckpointError,
    load_t2s_checkpoint,
    t2s_from_manifest,
)
from models.gpt_sovits.t2s_decode import decode, decode_batch, max_tokens_for_early_stop
from models.sampling import AutoregressiveSampling

FIXTURES = Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "gpt_sovits_v2"
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"shared fixtures absent: {FIXTURES}")


@pytest.fixture(scope="module")
def tiny_model():
    return load_t2s_checkpoint(FIXTURES / "tiny_gpt.ckpt").model


@pytest.fixture(scope="module")
def cases() -> dict[str, torch.Tensor]:
    return torch.load(FIXTURES / "cases.pt", map_location="cpu", weights_only=True)


def test_every_fixture_check_passes():
    checks = list(t2s_checks(FIXTURES))
    failed = [check.line() for check in checks if not check.passed]
    assert not failed, "\n".join(failed)
    names = {check.name for check in checks}
    # Every T2S case is covered: the three full cases, reference-free and batched decoding.
    for case in ("case0", "case1", "case2"):
        assert {f"{case}/t2s.infer_panel.y", f"{case}/t2s.infer_panel.idx", f"{case}/t2s.logits_first3",
                f"{case}/t2s.logits_all_steps", f"{case}/t2s.pred_semantic"} <= names
    assert {"extra_t2s_ref_free/t2s.infer_panel.y", "extra_t2s_batch/t2s.y0", "extra_t2s_batch/t2s.y1",
            "extra_t2s_batch/t2s.idx0", "extra_t2s_batch/t2s.idx1", "extra_t2s_batch/t2s.logits_first3"} <= names
    assert len(checks) == 24


def test_full_size_manifest_builds_with_its_exact_keys_and_shapes():
    manifest = json.loads((FIXTURES / "manifest_official_t2s.json").read_text())
    model = t2s_from_manifest(FIXTURES / "manifest_official_t2s.json")
    state = model.state_dict()
    assert ["model." + key for key in state] == list(manifest["weight"])
    assert sum(t.numel() for t in state.values()) == manifest["total_parameters"] == 77_606_402
    assert (model.config.num_layers, model.config.hidden_dim, model.config.num_heads) == (24, 512, 16)


def test_manifest_with_an_extra_key_is_refused(tmp_path):
    manifest = json.loads((FIXTURES / "manifest_official_t2s.json").read_text())
    manifest["weight"]["model.h.final_norm.weight"] = {"shape": [512], "dtype_in_file": "float16"}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    with pytest.raises(T2SCheckpointError, match="missing keys \\['h.final_norm.weight'\\]"):
        t2s_from_manifest(path)


def test_loaded_weights_are_the_file_weights_in_float32(tiny_model):
    raw = torch.load(FIXTURES / "tiny_gpt.ckpt", weights_only=True)["weight"]
    state = tiny_model.state_dict()
    assert all(state[key.removeprefix("model.")].dtype == torch.float32 for key in raw)
    assert torch.equal(state["h.layers.1.self_attn.in_proj_weight"],
                       raw["model.h.layers.1.self_attn.in_proj_weight"].float())


def test_truncated_checkpoint_gives_a_clear_error(tmp_path):
    data = (FIXTURES / "tiny_gpt.ckpt").read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(T2SCheckpointError, match="truncated.ckpt.*is the file complete"):
        load_t2s_checkpoint(truncated)


def test_non_checkpoint_bytes_give_a_clear_error(tmp_path):
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a torch zip" * 100)
    with pytest.raises(T2SCheckpointError, match="cannot read .*garbage.ckpt as a GPT-SoVITS GPT checkpoint"):
        load_t2s_checkpoint(garbage)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.ckpt"):
        load_t2s_checkpoint(tmp_path / "absent.ckpt")


def test_renamed_and_misshapen_keys_are_listed(tmp_path):
    content = torch.load(FIXTURES / "tiny_gpt.ckpt", weights_only=True)
    weight = OrderedDict(content["weight"])
    weight["model.ar_predict_layer.bias"] = weight.pop("model.ar_predict_layer.weight")
    weight["model.bert_proj.bias"] = torch.zeros(3, dtype=torch.float16)
    content["weight"] = weight
    broken = tmp_path / "broken.ckpt"
    torch.save(content, broken)
    with pytest.raises(T2SCheckpointError) as error:
        load_t2s_checkpoint(broken)
    message = str(error.value)
    assert "missing keys ['ar_predict_layer.weight']" in message
    assert "unexpected keys ['ar_predict_layer.bias']" in message
    assert "bert_proj.bias (3,) (network: (64,))" in message


def test_checkpoint_without_model_prefix_is_refused(tmp_path):
    content = torch.load(FIXTURES / "tiny_gpt.ckpt", weights_only=True)
    content["weight"] = OrderedDict((key.removeprefix("model."), value) for key, value in content["weight"].items())
    unprefixed = tmp_path / "unprefixed.ckpt"
    torch.save(content, unprefixed)
    with pytest.raises(T2SCheckpointError, match="should start with 'model.'"):
        load_t2s_checkpoint(unprefixed)


def test_sampling_with_the_same_seed_is_reproducible(tiny_model, cases):
    inputs = (cases["case0/t2s.phoneme_ids"], cases["case0/t2s.bert_feature"], cases["case0/t2s.prompt_semantic"])

    def sampled(seed: int):
        sampling = AutoregressiveSampling(top_k=15, top_p=0.9, temperature=1.2, seed=seed, max_tokens=30)
        return decode(tiny_model, *inputs, sampling).tokens

    first, again, other = sampled(7), sampled(7), sampled(8)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_batched_sampling_with_the_same_seed_is_reproducible(tiny_model, cases):
    texts = [cases["extra_t2s_batch/t2s.x0"], cases["extra_t2s_batch/t2s.x1"]]
    berts = [cases["extra_t2s_batch/t2s.bert0"], cases["extra_t2s_batch/t2s.bert1"]]
    sampling = AutoregressiveSampling(top_k=10, seed=3, max_tokens=25)
    first = decode_batch(tiny_model, texts, berts, cases["extra_t2s_batch/t2s.prompts"], sampling)
    again = decode_batch(tiny_model, texts, berts, cases["extra_t2s_batch/t2s.prompts"], sampling)
    assert [r.y.tolist() for r in first] == [r.y.tolist() for r in again]


def test_max_tokens_stops_and_keeps_the_last_token(tiny_model, cases):
    result = decode(tiny_model, cases["case1/t2s.phoneme_ids"], cases["case1/t2s.bert_feature"],
                    cases["case1/t2s.prompt_semantic"], AutoregressiveSampling.deterministic(max_tokens=5))
    assert (len(result.tokens), result.idx, result.stopped_by) == (5, 4, "max_tokens")
    assert max_tokens_for_early_stop(40) == 41 and max_tokens_for_early_stop(-1) == 1500


def test_prompt_tokens_outside_the_codebook_are_refused(tiny_model, cases):
    prompt = cases["case0/t2s.prompt_semantic"].clone()
    prompt[0, 3] = 1024  # EOS is not a codebook id
    with pytest.raises(ValueError, match=r"prompt semantic tokens must lie in \[0, 1024\)"):
        decode(tiny_model, cases["case0/t2s.phoneme_ids"], cases["case0/t2s.bert_feature"], prompt,
               AutoregressiveSampling.deterministic(max_tokens=3))
