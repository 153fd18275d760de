"""Check our EmotiVoice port against reference fixtures computed by the official code.

    python -m models.emotivoice.check_fixtures ../shared/fixtures/emotivoice

The directory holds (whatever the model sizes): one generator config ``*.yaml`` (official
config/joint layout), generator weights ``{'generator': ...}`` in any number of ``*.pt`` files
(both weight-norm namings), ``cases.pt``; a style encoder ``{'model': ...}``, its BERT config
``*bert_config.json`` and ``style_cases.pt``; and optionally the full-size manifests
``manifest_official_*.json``. Each generator file runs every case; durations must be equal,
every float output and intermediate within 1e-4 of its peak, int16 audio within 1 LSB.
One line per check, a summary, exit status 1 on any failure.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import yaml
from transformers import BertConfig

from core.fixture_check import Check, close_to_peak, exactly_equal, run_checks
from models.emotivoice.checkpoints import generator_from_state, normalize_generator_state, random_state, read_manifest
from models.emotivoice.style_checkpoints import manifest_bert_config, normalize_style_state, style_encoder_from_state
from models.emotivoice.generator import EmotiVoiceGenerator
from models.emotivoice.style_encoder import StyleEncoder

# Fixture intermediate name -> the submodule whose output it is (names as in the official model).
GENERATOR_HOOKS = {
    "token_embedding": "am.src_word_emb",
    "encoder_output": "am.encoder",
    "speaker_embedding": "am.spk_tokenizer",
    "projected_hidden": "am.embed_projection1",
    "duration_log_domain_raw": "am.duration_predictor.linear",
    "pitch_embedding": "am.pitch_embed",
    "energy_embedding": "am.energy_embed",
    "upsampled_hidden": "am.length_regulator",
    "decoder_output": "am.decoder",
    "vocoder_conv_pre_output": "generator.conv_pre",
}
STYLE_OUTPUTS = ("pooled_output", "pitch_outputs", "speed_outputs", "energy_outputs", "emotion_outputs")
INT16_SCALE = 32768.0  # the official wav -> int16 conversion (truncation toward zero)


@contextmanager
def captured_outputs(model: torch.nn.Module, names: dict[str, str]) -> Iterator[dict[str, torch.Tensor]]:
    """Outputs of ``model``'s submodules during the block, by fixture name."""
    captured: dict[str, torch.Tensor] = {}
    modules = dict(model.named_modules())
    handles = [modules[path].register_forward_hook(
        lambda _module, _inputs, output, name=name: captured.__setitem__(name, output))
        for name, path in names.items()]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def case_names(cases: dict[str, torch.Tensor]) -> list[str]:
    return sorted({key.split("/")[0] for key in cases})


def _load(path: Path):
    return torch.load(path, map_location="cpu", weights_only=True)


def _checkpoints(directory: Path, top_key: str) -> list[Path]:
    """The ``*.pt`` files of ``directory`` whose top-level dict holds ``top_key``."""
    found = []
    for path in sorted(directory.glob("*.pt")):
        content = _load(path)
        if isinstance(content, dict) and set(content) == {top_key}:
            found.append(path)
    return found


def _one(directory: Path, pattern: str) -> Path:
    matches = sorted(directory.glob(pattern))
    if len(matches) != 1:
        raise FileNotFoundError(f"{directory} needs exactly one {pattern}, found {[m.name for m in matches]}")
    return matches[0]


def int16_within_one(name: str, audio: torch.Tensor, expected: torch.Tensor) -> Check:
    if tuple(audio.shape) != tuple(expected.shape):
        return Check(name, False, f"shape {tuple(audio.shape)} != reference {tuple(expected.shape)}")
    worst = int((audio.long() - expected.long()).abs().max())
    return Check(name, worst <= 1, f"max difference {worst} LSB (bound 1)")


def generator_case_checks(model: EmotiVoiceGenerator, cases: dict[str, torch.Tensor], case: str,
                          label: str) -> Iterator[Check]:
    """One case run the official way (masked=False): every stored output and intermediate."""
    given = {key.split("/", 2)[2]: value for key, value in cases.items() if key.startswith(f"{case}/input/")}
    with torch.no_grad(), captured_outputs(model, GENERATOR_HOOKS) as intermediates:
        out = model(given["inputs_ling"], given["input_lengths"], given["inputs_speaker"],
                    given["inputs_style_embedding"], given["inputs_content_embedding"], masked=False)
    ours = {
        "dec_outputs": out["mel"],
        "pitch_predictions": out["pitch"].squeeze(),  # the official output squeezes B=1 away
        "energy_predictions": out["energy"].squeeze(),
        "wav_predictions": out["audio"].unsqueeze(1),
        **intermediates,
    }
    prefix = f"{label}/{case}"
    yield exactly_equal(f"{prefix}/log_duration_predictions", out["durations"],
                        cases[f"{case}/output/log_duration_predictions"])
    for key, expected in sorted(cases.items()):
        _, kind, name = key.split("/", 2)
        if not key.startswith(f"{case}/") or kind == "input" or name == "log_duration_predictions":
            continue
        if name == "audio_int16":
            audio = (out["audio"].squeeze(0) * INT16_SCALE).to(torch.int16)
            yield int16_within_one(f"{prefix}/audio_int16", audio, expected)
        elif name not in ours:
            yield Check(f"{prefix}/{kind}/{name}", False, "no output of ours corresponds to this reference tensor")
        else:
            yield close_to_peak(f"{prefix}/{kind}/{name}", ours[name], expected)


def generator_checks(directory: Path) -> Iterator[Check]:
    with open(_one(directory, "*.yaml"), encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    cases = _load(directory / "cases.pt")
    weight_files = _checkpoints(directory, "generator")
    if not weight_files:
        raise FileNotFoundError(f"{directory} has no {{'generator': ...}} checkpoint (*.pt)")
    for path in weight_files:
        model = generator_from_state(_load(path)["generator"], config)
        for case in case_names(cases):
            yield from generator_case_checks(model, cases, case, path.stem)


def style_checks(directory: Path) -> Iterator[Check]:
    bert_config = BertConfig.from_json_file(str(_one(directory, "*bert_config.json")))
    cases = _load(directory / "style_cases.pt")
    for path in _checkpoints(directory, "model"):
        model: StyleEncoder = style_encoder_from_state(_load(path)["model"], bert_config)
        for case in case_names(cases):
            given = {key.split("/", 2)[2]: value for key, value in cases.items() if key.startswith(f"{case}/input/")}
            with torch.no_grad():
                _, last_hidden = model.pooled(given["input_ids"], given["token_type_ids"], given["attention_mask"])
                out = model(given["input_ids"], given["token_type_ids"], given["attention_mask"])
            prefix = f"{path.stem}/{case}"
            for name in STYLE_OUTPUTS:
                yield close_to_peak(f"{prefix}/output/{name}", out[name], cases[f"{case}/output/{name}"])
            # Padded positions of a batch row are never read; compare the real tokens only.
            valid = given["attention_mask"].bool()
            yield close_to_peak(f"{prefix}/intermediate/last_hidden_state", last_hidden[valid],
                                cases[f"{case}/intermediate/last_hidden_state"][valid])


def manifest_checks(directory: Path) -> Iterator[Check]:
    """The full-size layouts: every manifest key lands on our modules, none missing or left over."""
    generator_manifest = directory / "manifest_official_generator.json"
    if generator_manifest.is_file():
        manifest = read_manifest(generator_manifest)
        for naming in ("state_dict", "state_dict_parametrizations_naming"):
            state = random_state(manifest[naming], seed=0)
            model = generator_from_state(state, manifest["config_used"])
            kept = len(normalize_generator_state(state))
            yield Check(f"manifest_generator/{naming}", kept == len(model.state_dict()),
                        f"{len(state)} keys, {kept} loaded strictly ({len(state) - kept} training-only aligner keys)")
    style_manifest = directory / "manifest_official_style_encoder.json"
    if style_manifest.is_file():
        manifest = read_manifest(style_manifest)
        for naming in ("state_dict", "state_dict_transformers_5"):
            state = random_state(manifest[naming], seed=0)
            model = style_encoder_from_state(state, manifest_bert_config(manifest))
            kept = len(normalize_style_state(state))
            yield Check(f"manifest_style_encoder/{naming}", kept == len(model.state_dict()),
                        f"{len(state)} keys, {kept} loaded strictly ({len(state) - kept} constant position_ids)")


def all_checks(directory: Path) -> Iterator[Check]:
    """Every check of a fixture directory, generator first (what the tests run)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"fixture directory {directory} not found")
    torch.manual_seed(0)
    yield from generator_checks(directory)
    yield from style_checks(directory)
    yield from manifest_checks(directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="a fixture directory such as ../shared/fixtures/emotivoice")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    return run_checks(all_checks(args.directory))


if __name__ == "__main__":
    sys.exit(main())
