"""LatentDataset files (models/training/decoder_training.py): one file, or shards that fit a GPU
call, the teacher's weights first and spread over the shards when they do not fit one."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from models.training.decoder_training import TEACHER_PREFIX, LatentDataset


def _build(config: dict) -> nn.Module:
    return nn.ConvTranspose1d(config["channels"], 1, config["hop"], config["hop"])


def _dataset(utterances: int = 7) -> LatentDataset:
    torch.manual_seed(0)
    teacher = _build({"channels": 64, "hop": 4})
    latents = [torch.randn(64, 200 + 37 * i) for i in range(utterances)]
    return LatentDataset(latents, teacher, {"channels": 64, "hop": 4}, hop_length=4, sample_rate_hz=16000)


def test_shards_stay_under_the_limit_and_load_back_as_one_dataset(tmp_path):
    dataset = _dataset()
    paths = dataset.save_shards(tmp_path, "latents", max_mib=0.1)
    assert len(paths) > 2
    assert all(path.stat().st_size < 0.1 * 2**20 + 4096 for path in paths)  # + the header
    loaded = LatentDataset.load(paths, _build)
    assert [z.shape for z in loaded.latents] == [z.shape for z in dataset.latents]
    for ours, theirs in zip(loaded.latents, dataset.latents):
        torch.testing.assert_close(ours, theirs.half().float(), rtol=0, atol=0)
    for name, weight in dataset.teacher_decoder.state_dict().items():  # float16-rounded in the shards
        torch.testing.assert_close(loaded.teacher_decoder.state_dict()[name], weight.half().float(), rtol=0, atol=0)


def test_incomplete_mixed_or_foreign_shards_are_refused(tmp_path):
    paths = _dataset().save_shards(tmp_path / "a", "latents", max_mib=0.1)
    with pytest.raises(ValueError, match="one whole writing"):
        LatentDataset.load(paths[1:], _build)  # the first shard (and the teacher) missing
    with pytest.raises(ValueError, match="one whole writing"):
        LatentDataset.load(paths + paths[-1:], _build)  # one shard twice
    other = _dataset()
    with torch.no_grad():
        other.teacher_decoder.weight.add_(1.0)
    other_paths = other.save_shards(tmp_path / "b", "latents", max_mib=0.1)
    with pytest.raises(ValueError, match="another teacher"):
        LatentDataset.load([paths[0], other_paths[0]], _build)
    again = _dataset().save_shards(tmp_path / "a", "latents", max_mib=0.1)  # the same voice, written again
    with pytest.raises(ValueError, match="one whole writing"):
        LatentDataset.load(again[:-1] + [other_paths[-1]], _build)
    with pytest.raises(ValueError, match="too small"):
        _dataset().save_shards(tmp_path / "c", "latents", max_mib=0.0001)  # 105 bytes: the teacher's weight is 512


def test_a_second_writing_removes_the_first_ones_shards(tmp_path):
    many = _dataset(7).save_shards(tmp_path, "latents", max_mib=0.1)
    few = _dataset(2).save_shards(tmp_path, "latents", max_mib=0.1)
    assert len(few) < len(many)
    assert sorted(tmp_path.glob("latents-*.safetensors")) == few  # a glob finds this writing only
    assert len(LatentDataset.load(few, _build).latents) == 2


def test_one_file_keeps_the_float32_teacher(tmp_path):
    dataset = _dataset(3)
    dataset.save(tmp_path / "one.safetensors")
    loaded = LatentDataset.load(tmp_path / "one.safetensors", _build)
    torch.testing.assert_close(loaded.teacher_decoder.weight, dataset.teacher_decoder.weight, rtol=0, atol=0)


def _build_wide(config: dict) -> nn.Module:
    return nn.Sequential(nn.Conv1d(config["channels"], config["hidden"], 3, padding=1),
                         nn.ConvTranspose1d(config["hidden"], 1, config["hop"], config["hop"]))


def test_a_teacher_larger_than_a_shard_spans_shards_and_loads_back_whole(tmp_path):
    torch.manual_seed(0)
    config = {"channels": 16, "hidden": 512, "hop": 4}
    teacher = _build_wide(config)  # 16*512*3 + 512*4 (+ biases) float16: about 53 KiB
    dataset = LatentDataset([torch.randn(16, 300 + 11 * i) for i in range(5)], teacher, config, hop_length=4,
                            sample_rate_hz=16000)
    paths = dataset.save_shards(tmp_path, "latents", max_mib=0.05)  # 51 KiB: the teacher takes two shards
    assert len(paths) >= 3
    assert all(path.stat().st_size < 0.05 * 2**20 + 4096 for path in paths)
    holding_teacher = [path for path in paths
                       if any(key.startswith(TEACHER_PREFIX) for key in load_file(str(path)))]
    assert len(holding_teacher) == 2
    loaded = LatentDataset.load(paths, _build_wide)
    for name, weight in teacher.state_dict().items():
        torch.testing.assert_close(loaded.teacher_decoder.state_dict()[name], weight.half().float(), rtol=0, atol=0)
    assert [z.shape for z in loaded.latents] == [z.shape for z in dataset.latents]
    with pytest.raises(ValueError, match="one whole writing"):
        LatentDataset.load(paths[1:], _build_wide)  # part of the teacher missing
