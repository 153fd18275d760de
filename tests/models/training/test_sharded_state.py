"""A training run's state in bounded safetensors shards: the round trip is exact, an optimizer resumes."""
from __future__ import annotations

import pytest
import torch

from models.training.sharded_state import has_state, load_state, save_state


def test_round_trip_keeps_every_tensor_key_type_and_scalar(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.99))
    model(torch.randn(4, 64)).square().mean().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 17, "note": None}
    shards = save_state(tmp_path, state, max_shard_bytes=20_000)  # 16 KiB weights: several shards
    assert len(shards) > 1 and has_state(tmp_path)
    loaded = load_state(tmp_path)
    assert loaded["step"] == 17 and loaded["note"] is None
    assert set(loaded["optimizer"]["state"]) == set(state["optimizer"]["state"])  # int keys stay int
    for key, value in state["model"].items():
        assert torch.equal(loaded["model"][key], value)
    for index, moments in state["optimizer"]["state"].items():
        for name, value in moments.items():
            assert torch.equal(loaded["optimizer"]["state"][index][name], value)
    resumed = torch.optim.AdamW(model.parameters(), lr=1e-3)
    resumed.load_state_dict(loaded["optimizer"])
    assert resumed.param_groups[0]["betas"][0] == 0.8


def test_a_smaller_save_removes_stale_shards(tmp_path):
    assert len(save_state(tmp_path, {"v": torch.zeros(3000), "w": torch.zeros(3000)}, max_shard_bytes=16_000)) == 2
    save_state(tmp_path, {"w": torch.ones(10)}, max_shard_bytes=16_000)
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["state-00-of-01.safetensors"]
    assert torch.equal(load_state(tmp_path)["w"], torch.ones(10))


def test_missing_or_mixed_shards_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no state shards"):
        load_state(tmp_path)
    save_state(tmp_path, {"a": torch.zeros(4000), "b": torch.zeros(4000)}, max_shard_bytes=16_000)
    (tmp_path / "state-01-of-02.safetensors").unlink()
    with pytest.raises(ValueError, match="incomplete or mixed"):
        load_state(tmp_path)


def test_unsupported_leaves_are_named(tmp_path):
    with pytest.raises(TypeError, match="/bad"):
        save_state(tmp_path, {"bad": object()})
    with pytest.raises(ValueError, match="over the"):
        save_state(tmp_path, {"big": torch.zeros(1000)}, max_shard_bytes=100)
