"""The GPT-SoVITS v2 SoVITS synthesizer and its RVQ against the official code's outputs, its
checkpoint loader (safe unpickling, version tags, corrupted files, the full-size manifest) and the
shared RVQ export rewrite.

    python -m pytest -q tests/models/gpt_sovits/test_sovits.py
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from export.rewrites.rvq import MatMulResidualVQ
from models.gpt_sovits.fixture_checks_sovits import sovits_checks
from models.gpt_sovits.sovits_checkpoint import (
    SovitsCheckpointError,
    load_sovits_checkpoint,
    read_sovits_file,
    sovits_from_manifest,
)
from models.gpt_sovits.spectrogram import reference_spectrogram

FIXTURES = Path(__file__).resolve().parents[3] / ".." / "shared" / "fixtures" / "gpt_sovits_v2"
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"shared fixtures absent: {FIXTURES}")
TINY_SOVITS = FIXTURES / "tiny_sovits.pth"


@pytest.fixture(scope="module")
def tiny():
    return load_sovits_checkpoint(TINY_SOVITS)


@pytest.fixture(scope="module")
def cases() -> dict[str, torch.Tensor]:
    return torch.load(FIXTURES / "cases.pt", map_location="cpu", weights_only=True)


def test_every_fixture_check_passes():
    checks = list(sovits_checks(FIXTURES))
    failed = [check.line() for check in checks if not check.passed]
    assert not failed, "\n".join(failed)
    names = {check.name for check in checks}
    for case in ("case0", "case1", "case2", "extra_batch_latent"):
        assert f"{case}/rvq_codes" in names and f"{case}/quantizer_decode" in names
    for case in ("case0", "case1", "case2"):
        assert {f"{case}/ge", f"{case}/m_p", f"{case}/flow_z", f"{case}/sovits_audio (noise 0)"} <= names
    assert "extra_noise/sovits_audio (noise 0.5)" in names
    assert "extra_speed/sovits_audio (noise 0, speed 1.25)" in names
    assert len(checks) == 41


def test_decode_entry_point_matches_the_official_audio(tiny, cases):
    references = [cases["case2/sovits.ref0.spec"], cases["case2/sovits.ref1.spec"]]
    with torch.no_grad():
        audio = tiny.model.decode(cases["case2/sovits.decode.codes"], cases["case2/sovits.decode.text"], references)
        noisy = tiny.model.decode(
            cases["extra_noise/sovits.decode.codes"], cases["extra_noise/sovits.decode.text"],
            [cases["extra_noise/sovits.decode.refer0"]], noise=cases["extra_noise/sovits.decode.noise"],
            noise_scale=0.5)
    expected = cases["case2/sovits.decode.audio"]
    assert audio.shape == expected.shape == (1, 1, 27 * tiny.model.samples_per_code)
    assert (audio - expected).abs().max() <= 1e-4 * max(1.0, float(expected.abs().max()))
    assert (noisy - cases["extra_noise/sovits.decode.audio"]).abs().max() <= 1e-4


def test_noise_is_never_drawn_inside(tiny, cases):
    codes, text = cases["case0/sovits.decode.codes"], cases["case0/sovits.decode.text"]
    with pytest.raises(ValueError, match="needs a noise tensor shaped"):
        tiny.model.decode(codes, text, [cases["case0/sovits.ref0.spec"]], noise_scale=0.5)


def test_reference_spectrogram_of_the_stored_clip(tiny, cases):
    spectrogram = reference_spectrogram(cases["case1/sovits.ref0.wav_32k"], tiny.config)
    # float32 FFTs differ by a few ulps between CPUs (3.1e-5 absolute, 2.4e-5 relative on an AMD EPYC).
    torch.testing.assert_close(spectrogram, cases["case1/sovits.ref0.spec"], rtol=1e-4, atol=1e-5)


def test_rvq_export_rewrite_gives_identical_codes(tiny, cases):
    """export/rewrites/rvq.py (MatMul + ArgMin + Gather) on our codebooks equals our encode."""
    rewrite = MatMulResidualVQ(tiny.model.quantizer.codebooks())
    for case in ("case0", "case1", "case2", "extra_batch_latent"):
        ssl = cases[f"{case}/sovits.extract_latent.ssl_content"]
        with torch.no_grad():
            latents = tiny.model.ssl_proj(ssl)  # (B, 768, T)
            quantized, codes = rewrite(latents.transpose(1, 2))  # (B, T, D), (B, T, S)
        assert torch.equal(codes.permute(0, 2, 1), cases[f"{case}/sovits.extract_latent.codes"])  # (B, S, T)
        assert torch.equal(codes.permute(2, 0, 1), tiny.model.quantizer.encode(latents))  # (S, B, T)
        torch.testing.assert_close(quantized.transpose(1, 2), tiny.model.quantizer.decode(codes.permute(2, 0, 1)))


def test_loaded_config_comes_from_the_file(tiny):
    assert tiny.hparams["model"]["version"] == "v2"
    assert tiny.info == "8epoch_96iteration" and tiny.version_tag is None
    assert tiny.config.upsample_initial_channel == 64 and tiny.config.inter_channels == 32
    assert tiny.config.phoneme_vocab_size == 732 and tiny.config.reference_bins == 704
    assert all(value.dtype == torch.float32 for value in tiny.model.state_dict().values())
    assert not any(key.startswith("enc_q") for key in tiny.model.state_dict())


def test_weight_norm_folds_over_the_transpose_convs_input_channels(tiny):
    raw = read_sovits_file(TINY_SOVITS)[0]
    g, v = raw["dec.ups.0.weight_g"].float(), raw["dec.ups.0.weight_v"].float()  # (in, 1, 1), (in, out, k)
    expected = g * v / v.norm(dim=(1, 2), keepdim=True)
    torch.testing.assert_close(tiny.model.dec.ups[0].weight.detach(), expected)


def test_version_tagged_file_loads(tiny, tmp_path):
    tagged = tmp_path / "tagged_v2.pth"
    tagged.write_bytes(b"01" + TINY_SOVITS.read_bytes()[2:])  # newer trainers overwrite "PK" with the version
    loaded = load_sovits_checkpoint(tagged)
    assert loaded.version_tag == "v2"
    for key, value in tiny.model.state_dict().items():
        assert torch.equal(value, loaded.model.state_dict()[key]), key


def test_unsupported_version_tag_is_refused(tmp_path):
    tagged = tmp_path / "v2pro.pth"
    tagged.write_bytes(b"05" + TINY_SOVITS.read_bytes()[2:])
    with pytest.raises(SovitsCheckpointError, match="tagged as a SoVITS v2Pro file"):
        load_sovits_checkpoint(tagged)


class _RunsShellCommand:
    def __reduce__(self):
        return os.system, ("echo this must never run",)


def test_pickle_naming_another_global_is_refused(tmp_path):
    malicious = tmp_path / "malicious.pth"
    torch.save({"weight": {}, "config": _RunsShellCommand(), "info": ""}, malicious)
    with pytest.raises(SovitsCheckpointError, match="names a Python global other than utils.HParams"):
        load_sovits_checkpoint(malicious)


def test_corrupted_file_gives_a_clear_error(tmp_path):
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(TINY_SOVITS.read_bytes()[: 100_000])
    with pytest.raises(SovitsCheckpointError, match="is the file complete"):
        load_sovits_checkpoint(truncated)
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"\x00\x01not a checkpoint")
    with pytest.raises(SovitsCheckpointError, match="not a SoVITS weights file"):
        load_sovits_checkpoint(garbage)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_sovits_checkpoint(tmp_path / "missing.pth")


def test_plain_dict_config_loads_and_uninitialised_codebook_is_refused(tiny, tmp_path):
    weights, hparams, info, _ = read_sovits_file(TINY_SOVITS)
    plain = tmp_path / "plain_config.pth"  # pretrained base files are said to carry a plain dict
    torch.save({"weight": weights, "config": hparams, "info": info}, plain)
    assert load_sovits_checkpoint(plain).config == tiny.config
    weights["quantizer.vq.layers.0._codebook.inited"] = torch.zeros(1, dtype=torch.float16)
    path = tmp_path / "uninitialised.pth"
    torch.save({"weight": weights, "config": hparams, "info": info}, path)
    with pytest.raises(SovitsCheckpointError, match="never initialised"):
        load_sovits_checkpoint(path)


def test_full_size_manifest_loads_with_every_key():
    manifest_path = FIXTURES / "manifest_official_sovits.json"
    manifest = json.loads(manifest_path.read_text())
    checkpoint = sovits_from_manifest(manifest_path)
    config = checkpoint.config
    assert (config.inter_channels, config.filter_channels, config.n_layers, config.upsample_initial_channel) == (
        192, 768, 6, 512)
    # Our parameters are the file's minus the weight-norm gains folded away.
    gains = sum(
        torch.Size(entry["shape"]).numel() for key, entry in manifest["weight"].items()
        if key.endswith(".weight_g") and entry["in_trained_weights_file"]
    )
    parameters = sum(p.numel() for p in checkpoint.model.parameters())
    assert parameters == manifest["total_parameters_in_trained_weights_file"] - gains
    with torch.no_grad():
        audio = checkpoint.model.decode(
            torch.randint(0, 1024, (1, 1, 10)), torch.randint(0, 732, (1, 8)), [torch.rand(1, 1025, 30)])
    assert audio.shape == (1, 1, 10 * checkpoint.model.samples_per_code) and torch.isfinite(audio).all()

