"""Our batched synthesis masks padding, so each row equals its single-utterance run; the official
batch computation (``masked=False``) does not (the fixture README: 54 frames against 53)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from models.emotivoice.checkpoints import load_generator

FIXTURES = Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "emotivoice"
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"shared fixtures {FIXTURES} absent")


@pytest.fixture(scope="module")
def generator_and_batch():
    with open(FIXTURES / "tiny_config.yaml", encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    model = load_generator(FIXTURES / "tiny_g.pt", config)
    cases = torch.load(FIXTURES / "cases.pt", weights_only=True)
    batch = [cases[f"batch/input/{name}"] for name in
             ("inputs_ling", "input_lengths", "inputs_speaker", "inputs_style_embedding", "inputs_content_embedding")]
    return model, batch


def _row(batch, index):
    ids, lengths, speakers, style, content = batch
    length = int(lengths[index])
    return (ids[index:index + 1, :length], lengths[index:index + 1], speakers[index:index + 1],
            style[index:index + 1], content[index:index + 1])


@torch.no_grad()
def test_masked_batch_rows_equal_single_runs(generator_and_batch):
    model, batch = generator_and_batch
    batched = model(*batch, masked=True)
    for index in range(batch[0].shape[0]):
        single = model(*_row(batch, index), masked=True)
        length = int(batch[1][index])
        frames = int(single["frame_lengths"][0])
        assert torch.equal(batched["durations"][index, :length], single["durations"][0])
        assert int(batched["frame_lengths"][index]) == frames
        mel_error = (batched["mel"][index, :frames] - single["mel"][0]).abs().max()
        assert mel_error <= 1e-5 * single["mel"].abs().max()
        samples = int(single["audio_lengths"][0])
        audio_error = (batched["audio"][index, :samples] - single["audio"][0]).abs().max()
        assert audio_error <= 1e-5 * single["audio"].abs().max()


@torch.no_grad()
def test_official_batching_leaks_padding_and_single_runs_are_the_same_either_way(generator_and_batch):
    model, batch = generator_and_batch
    official = model(*batch, masked=False)
    assert official["durations"][1].sum() == 54  # the padded row; 53 when run alone
    single = _row(batch, 1)
    assert model(*single, masked=False)["durations"].sum() == 53
    assert torch.equal(model(*single, masked=True)["audio"], model(*single, masked=False)["audio"])
