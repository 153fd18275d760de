"""SoVITS and RVQ checks against a GPT-SoVITS v2 fixture directory (``../shared/fixtures/gpt_sovits_v2``
format): the SoVITS ``*.pth`` in the directory, ``cases.pt`` and ``cases_meta.json``. The family's
``check_fixtures`` command runs these beside the T2S checks:

    python -m models.gpt_sovits.check_fixtures ../shared/fixtures/gpt_sovits_v2

Every case found in ``cases.pt`` is run from its stored inputs, stage by stage:
* ``sovits.refN.wav_32k`` -> our spectrogram vs ``sovits.refN.spec``;
* ``sovits.extract_latent``: ``ssl_proj`` output and the codes (exact);
* ``sovits.quantizer_decode``: codes (n_q, B, T) -> latents;
* ``sovits.decode``: reference embeddings, their mean, the prior, the flow input and output and the
  audio, with noise 0 or the stored noise at the case's ``noise_scale``, at the case's ``speed``.
Integers must match exactly; floats within 1e-4 of the reference's peak.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from core.fixture_check import Check, close_to_peak, exactly_equal
from models.gpt_sovits.sovits import SovitsSynthesizer
from models.gpt_sovits.sovits_checkpoint import load_sovits_checkpoint
from models.gpt_sovits.spectrogram import linear_spectrogram

FLOAT_TOLERANCE = 1e-4  # of the reference's peak (the fixture README's bound)


def _sovits_file(fixture_dir: Path) -> Path:
    candidates = sorted(fixture_dir.glob("*.pth"))
    if len(candidates) != 1:
        raise FileNotFoundError(
            f"{fixture_dir} should hold exactly one SoVITS *.pth weights file, found {[p.name for p in candidates]}")
    return candidates[0]


def _numbered(cases: dict[str, torch.Tensor], pattern: str) -> list[str]:
    """Keys matching ``pattern`` (with one ``(\\d+)`` group), in numeric order."""
    matches = [(int(m.group(1)), key) for key in cases if (m := re.fullmatch(pattern, key))]
    return [key for _, key in sorted(matches)]


def _latent_checks(model: SovitsSynthesizer, case: str, cases: dict[str, torch.Tensor]) -> Iterator[Check]:
    prefix = f"{case}/sovits.extract_latent."
    if prefix + "ssl_content" in cases:
        ssl = cases[prefix + "ssl_content"]
        if prefix + "ssl_proj_out" in cases:
            projected = model.ssl_proj(ssl)  # (B, 768, T // 2)
            yield close_to_peak(f"{case}/ssl_proj", projected, cases[prefix + "ssl_proj_out"], FLOAT_TOLERANCE)
        yield exactly_equal(f"{case}/rvq_codes", model.extract_latent(ssl), cases[prefix + "codes"])
    prefix = f"{case}/sovits.quantizer_decode."
    if prefix + "codes_nq_b_t" in cases:
        quantized = model.quantizer.decode(cases[prefix + "codes_nq_b_t"])
        yield close_to_peak(f"{case}/quantizer_decode", quantized, cases[prefix + "quantized"], FLOAT_TOLERANCE)


def _reference_spectrograms(case: str, cases: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    stored = _numbered(cases, re.escape(case) + r"/sovits\.ref(\d+)\.spec")
    stored = stored or _numbered(cases, re.escape(case) + r"/sovits\.decode\.refer(\d+)")
    return [cases[key] for key in stored]


def _decode_checks(
    model: SovitsSynthesizer, case: str, cases: dict[str, torch.Tensor], case_meta: dict
) -> Iterator[Check]:
    prefix = f"{case}/sovits.decode."
    references = _reference_spectrograms(case, cases)
    for index, spectrogram in enumerate(references):
        if prefix + f"ge_ref{index}" in cases:
            embedding = model.ref_enc(spectrogram)  # (1, gin, 1)
            yield close_to_peak(f"{case}/ref_enc_{index}", embedding, cases[prefix + f"ge_ref{index}"], FLOAT_TOLERANCE)
    ge = model.reference_embedding(references)
    if prefix + "ge" in cases:
        yield close_to_peak(f"{case}/ge", ge, cases[prefix + "ge"], FLOAT_TOLERANCE)
    speed = float(case_meta.get("speed", 1.0))
    m_p, logs_p, mask = model.prior(cases[prefix + "codes"], cases[prefix + "text"], ge, speed)
    for name, value in (("m_p", m_p), ("logs_p", logs_p), ("y_mask", mask)):
        if prefix + name in cases:
            yield close_to_peak(f"{case}/{name}", value, cases[prefix + name], FLOAT_TOLERANCE)
    noise = cases.get(prefix + "noise")
    noise_scale = float(case_meta.get("noise_scale", 0.0)) if noise is not None else 0.0
    if prefix + "z_p" in cases:
        z_p = m_p + noise * torch.exp(logs_p) * noise_scale if noise is not None else m_p
        yield close_to_peak(f"{case}/z_p", z_p, cases[prefix + "z_p"], FLOAT_TOLERANCE)
    z, audio = model.synthesize_latent(m_p, logs_p, mask, ge, noise, noise_scale)
    if prefix + "z" in cases:
        yield close_to_peak(f"{case}/flow_z", z, cases[prefix + "z"], FLOAT_TOLERANCE)
    label = f"noise {noise_scale:g}" + (f", speed {speed:g}" if speed != 1 else "")
    yield close_to_peak(f"{case}/sovits_audio ({label})", audio, cases[prefix + "audio"], FLOAT_TOLERANCE)


def sovits_checks(fixture_dir: Path) -> Iterator[Check]:
    """Every SoVITS/RVQ check the fixture directory's cases support, one ``Check`` each."""
    fixture_dir = Path(fixture_dir)
    model = load_sovits_checkpoint(_sovits_file(fixture_dir)).model
    cases = torch.load(fixture_dir / "cases.pt", map_location="cpu", weights_only=True)
    meta = json.loads((fixture_dir / "cases_meta.json").read_text()).get("cases", {})
    case_names = sorted({key.split("/", 1)[0] for key in cases if "/sovits." in key})
    config = model.config
    with torch.no_grad():
        for case in case_names:
            for wav_key in _numbered(cases, re.escape(case) + r"/sovits\.ref(\d+)\.wav_32k"):
                spec_key = wav_key.replace(".wav_32k", ".spec")
                spectrogram = linear_spectrogram(
                    cases[wav_key], config.filter_length, config.hop_length, config.win_length)
                name = f"{case}/spectrogram_{wav_key.rsplit('.ref', 1)[1].split('.')[0]}"
                yield close_to_peak(name, spectrogram, cases[spec_key], FLOAT_TOLERANCE)
            yield from _latent_checks(model, case, cases)
            if f"{case}/sovits.decode.codes" in cases:
                yield from _decode_checks(model, case, cases, meta.get(case, {}))
