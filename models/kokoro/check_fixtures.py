"""Kokoro against the official code's reference cases, one line per check and a summary:

    python -m models.kokoro.check_fixtures ../shared/fixtures/kokoro/tiny

DIR holds ``cases.pt``, the checkpoint it names (official file layout) and ``tiny_config.json``
(or ``config.json``). Strict checks (rtol 1e-4 of the peak, integers exact) cover everything up to
and including the harmonic source; audio and conv_post outputs are held to 1e-3 where the
official float32 run is well conditioned (captured noise, CustomSTFT). Elsewhere the generator
reads the phase of near-real STFT bins (symmetric edge frames, silent high bins), whose sign is
rounding noise that an FFT and a convolution round differently; there the checks are spectral
(log-spectrogram distance, correlation), with bounds far below what the official model's own
random draws change (0.30 log10 between its noise-off and captured-noise audio). The 240-sample
decoder cases are too short for a spectrum and also feed zero F0 (a zero source, whose phase is
arbitrary); they keep the README's bound of ten times the recorded float32-vs-float64 deviation.
"""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from core.fixture_check import Check, close_to_peak, exactly_equal, run_checks
from models.kokoro.checkpoint import load_official_checkpoint
from models.kokoro.config import KokoroConfig
from models.kokoro.decoder import SourceNoise
from models.kokoro.model import KokoroModel
from models.kokoro.stft import ConvStft

STRICT = 1e-4  # fixture README: f32 vs f64 deviation <= 7e-5 of the peak up to har_source
WELL_CONDITIONED_AUDIO = 1e-3  # captured noise + CustomSTFT: <= 1.1e-3 relative
LOG_SPECTRUM_BOUND = 0.05  # mean |log10 magnitude difference|; measured 0.008-0.012 on the tiny cases
CORRELATION_BOUND = 0.99  # conv_post_out on the ill-conditioned path; measured >= 0.998
LOOSE_FACTOR = 10.0  # short decoder cases: ten times the recorded float32-vs-float64 deviation
CONFIG_NAMES = ("tiny_config.json", "config.json")
DECODER_HOOKS = ("decoder_encode_out", "generator_in", "har_source", "conv_post_out")


def _config(fixture_dir: Path) -> KokoroConfig:
    for name in CONFIG_NAMES:
        if (fixture_dir / name).is_file():
            return KokoroConfig.from_json(fixture_dir / name)
    raise FileNotFoundError(f"{fixture_dir} has none of {list(CONFIG_NAMES)}")


def _record_decoder(model: KokoroModel) -> tuple[dict[str, torch.Tensor], list]:
    """Forward hooks that store the decoder's boundary tensors under the fixture's names."""
    seen: dict[str, torch.Tensor] = {}
    decoder = model.decoder

    def keep(name):
        return lambda module, inputs, output: seen.__setitem__(name, output)

    handles = [
        decoder.encode.register_forward_hook(keep("decoder_encode_out")),
        decoder.generator.register_forward_pre_hook(lambda module, inputs: seen.__setitem__("generator_in", inputs[0])),
        decoder.generator.m_source.register_forward_hook(keep("har_source")),
        decoder.generator.conv_post.register_forward_hook(keep("conv_post_out")),
    ]
    return seen, handles


def _noise(inputs: dict) -> SourceNoise | None:
    if "rand_ini_draw" not in inputs:
        return None
    return SourceNoise(initial_phase=inputs["rand_ini_draw"], additive=inputs["sine_noise_draw"])


def _well_conditioned(case_name: str) -> bool:
    """The fixture README's well-conditioned audio path: captured noise through CustomSTFT."""
    return "captured_noise" in case_name and "CustomSTFT" in case_name


def _recorded_bound(case_name: str, key: str, meta: dict) -> float:
    """Ten times the official float32-vs-float64 deviation of this output, relative to its peak."""
    for section in ("outputs", "intermediates"):
        record = meta["float64_vs_float32_max_abs_diff"].get(f"{case_name}/{section}/{key}")
        if record:
            return max(WELL_CONDITIONED_AUDIO, LOOSE_FACTOR * record["max_abs_diff"] / record["max_abs_ref"])
    raise KeyError(f"fixture meta records no float64 deviation for {case_name}/{key}")


def _log_spectrum(audio: torch.Tensor) -> torch.Tensor:
    audio = audio.reshape(-1).double()
    n_fft = min(256, audio.numel())
    magnitude = torch.stft(audio, n_fft, n_fft // 4, window=torch.hann_window(n_fft, dtype=torch.float64),
                           return_complex=True).abs()
    return torch.log10(magnitude.clamp(min=1e-5))


def log_spectrum_check(name: str, actual: torch.Tensor, expected: torch.Tensor) -> Check:
    if actual.numel() != expected.numel():
        return Check(name, False, f"{actual.numel()} samples != reference {expected.numel()}")
    distance = float((_log_spectrum(actual) - _log_spectrum(expected)).abs().mean())
    return Check(name, distance <= LOG_SPECTRUM_BOUND,
                 f"log-spectrum distance {distance:.4f} log10 (bound {LOG_SPECTRUM_BOUND})")


def correlation_check(name: str, actual: torch.Tensor, expected: torch.Tensor) -> Check:
    if actual.shape != expected.shape:
        return Check(name, False, f"shape {tuple(actual.shape)} != reference {tuple(expected.shape)}")
    correlation = float(torch.corrcoef(torch.stack([actual.reshape(-1), expected.reshape(-1)]).double())[0, 1])
    return Check(name, correlation >= CORRELATION_BOUND,
                 f"correlation {correlation:.5f} (bound {CORRELATION_BOUND})")


def _tensor_check(case_name: str, key: str, actual: torch.Tensor, expected: torch.Tensor, meta: dict) -> Check:
    name = f"{case_name}/{key}"
    if expected.dtype in (torch.int64, torch.int32):
        return exactly_equal(name, actual, expected)
    if key in ("audio", "conv_post_out") and _well_conditioned(case_name):
        return close_to_peak(name, actual, expected, WELL_CONDITIONED_AUDIO)
    if key in ("audio", "conv_post_out") and case_name.startswith("decoder_fixed_inputs"):
        return close_to_peak(name, actual, expected, _recorded_bound(case_name, key, meta))
    if key == "audio":
        return log_spectrum_check(name, actual, expected)
    if key == "conv_post_out":
        return correlation_check(name, actual, expected)
    return close_to_peak(name, actual, expected, STRICT)


@torch.no_grad()
def _forward_case(model: KokoroModel, case_name: str, case: dict, meta: dict) -> Iterator[Check]:
    inputs = case["inputs"]
    seen, handles = _record_decoder(model)
    try:
        out = model.forward_with_tokens(inputs["input_ids"], inputs["ref_s"], float(inputs["speed"]), _noise(inputs))
    finally:
        for handle in handles:
            handle.remove()
    produced = {**out.intermediates, **seen, "pred_dur": out.frames_per_token.squeeze(0), "audio": out.audio.squeeze(0),
                "predictor_lstm_out": model.predictor.lstm(out.intermediates["d"])[0]}
    for key, expected in case["intermediates"].items():
        yield _tensor_check(case_name, key, produced[key], expected, meta)
    for key, expected in case["outputs"].items():
        yield _tensor_check(case_name, key, produced[key], expected, meta)


@torch.no_grad()
def _decoder_case(model: KokoroModel, case_name: str, case: dict, meta: dict) -> Iterator[Check]:
    inputs = case["inputs"]
    seen, handles = _record_decoder(model)
    try:
        audio = model.decoder(inputs["asr"], inputs["F0_curve"], inputs["N"], inputs["s"], _noise(inputs))
    finally:
        for handle in handles:
            handle.remove()
    for key, expected in case.get("intermediates", {}).items():
        yield _tensor_check(case_name, key, seen[key], expected, meta)
    yield _tensor_check(case_name, "audio", audio, case["outputs"]["audio"], meta)


@torch.no_grad()
def _module_case(model: KokoroModel, case_name: str, case: dict) -> Iterator[Check]:
    inputs, outputs = case["inputs"], case["outputs"]
    if case_name.startswith("text_encoder"):
        actual = model.text_encoder(inputs["input_ids"], inputs["input_lengths"], inputs["text_mask"])
        yield close_to_peak(f"{case_name}/t_en", actual, outputs["t_en"], STRICT)
    elif case_name.startswith("bert"):
        actual = model.bert(inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
        valid = inputs["attention_mask"].bool()  # padded rows depend on the attention backend
        yield close_to_peak(f"{case_name}/bert_dur[valid]", actual[valid], outputs["bert_dur"][valid], STRICT)
    elif case_name.startswith("duration_encoder"):
        actual = model.predictor.text_encoder(inputs["d_en"], inputs["s"], inputs["input_lengths"], inputs["text_mask"])
        yield close_to_peak(f"{case_name}/d", actual, outputs["d"], STRICT)
    elif case_name.startswith("F0Ntrain"):
        f0, energy = model.predictor.F0Ntrain(inputs["en"], inputs["s"])
        yield close_to_peak(f"{case_name}/F0_pred", f0, outputs["F0_pred"], STRICT)
        yield close_to_peak(f"{case_name}/N_pred", energy, outputs["N_pred"], STRICT)
    else:
        raise ValueError(f"case {case_name!r}: no Kokoro module answers it")


def _wrapped_phase_check(name: str, actual: torch.Tensor, expected: torch.Tensor) -> Check:
    """Phases compared modulo 2pi, as a fraction of pi."""
    difference = torch.remainder(actual - expected + math.pi, 2 * math.pi) - math.pi
    error = float(difference.abs().max()) / math.pi
    return Check(name, error <= STRICT, f"max wrapped error {error:.2e} of pi (bound {STRICT:.0e})")


def _stft_case(case_name: str, case: dict) -> Iterator[Check]:
    inputs, outputs = case["inputs"], case["outputs"]
    for variant, prefix in (("torch", "torch"), ("custom", "custom")):
        stft = ConvStft(int(inputs["n_fft"]), int(inputs["hop"]), variant)
        magnitude, phase = stft.transform(inputs["x"])
        yield close_to_peak(f"{case_name}/{prefix}_mag", magnitude, outputs[f"{prefix}_mag"], STRICT)
        yield _wrapped_phase_check(f"{case_name}/{prefix}_phase", phase, outputs[f"{prefix}_phase"])
        inverse = stft.inverse(inputs["magnitude"], inputs["phase"])
        yield close_to_peak(f"{case_name}/{prefix}_inverse", inverse, outputs[f"{prefix}_inverse"], STRICT)


def fixture_checks(fixture_dir: Path) -> Iterator[Check]:
    """Every case of ``fixture_dir`` (cases.pt + the checkpoint it names + its config)."""
    fixture_dir = Path(fixture_dir)
    fixtures = torch.load(fixture_dir / "cases.pt", map_location="cpu", weights_only=True)
    meta = fixtures["meta"]
    config = _config(fixture_dir)
    checkpoint = fixture_dir / meta.get("checkpoint", "kokoro_tiny.pth")
    models = {variant: load_official_checkpoint(checkpoint, config, variant) for variant in ("torch", "custom")}
    for case_name, case in fixtures["cases"].items():
        model = models["custom" if "CustomSTFT" in case_name else "torch"]
        if case_name.startswith("forward_with_tokens"):
            yield from _forward_case(model, case_name, case, meta)
        elif case_name.startswith("decoder_fixed_inputs"):
            yield from _decoder_case(model, case_name, case, meta)
        elif case_name.startswith("stft_variants"):
            yield from _stft_case(case_name, case)
        else:
            yield from _module_case(model, case_name, case)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fixture_dir", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    return run_checks(fixture_checks(args.fixture_dir))


if __name__ == "__main__":
    sys.exit(main())
