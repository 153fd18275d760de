"""Fixture checks of the text-to-semantic model against outputs of the official code.

    from models.gpt_sovits.fixture_checks_t2s import t2s_checks
    run_checks(t2s_checks(Path("../shared/fixtures/gpt_sovits_v2")))

The fixture directory holds one GPT ``*.ckpt`` (any size: shapes come from its own config),
``cases.pt`` (a flat ``{"<case>/<tensor>": Tensor}``) and ``cases_meta.json`` (the sampling
arguments the references were decoded with). A case with ``t2s.phoneme_ids`` is one utterance
(reference-free when it has no ``t2s.prompt_semantic``); a case with ``t2s.x0`` is a batch.
Tokens and ``idx`` must match exactly; logits within 1e-4 of the reference's peak.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from core.fixture_check import Check, close_to_peak, exactly_equal
from models.gpt_sovits.t2s import Text2SemanticModel
from models.gpt_sovits.t2s_checkpoint import load_t2s_checkpoint
from models.gpt_sovits.t2s_decode import decode, decode_batch, max_tokens_for_early_stop
from models.sampling import AutoregressiveSampling


def find_gpt_checkpoint(fixture_dir: Path) -> Path:
    found = sorted(fixture_dir.glob("*.ckpt"))
    if len(found) != 1:
        raise FileNotFoundError(f"{fixture_dir}: expected exactly one GPT checkpoint (*.ckpt), found "
                                f"{[p.name for p in found]}")
    return found[0]


def reference_sampling(meta: dict) -> AutoregressiveSampling:
    """The sampling arguments the references were decoded with (``cases_meta.json`` ``t2s_sampling``)."""
    arguments = meta["t2s_sampling"]
    return AutoregressiveSampling(top_k=int(arguments["top_k"]), top_p=float(arguments["top_p"]),
                                  temperature=float(arguments["temperature"]),
                                  repetition_penalty=float(arguments["repetition_penalty"]),
                                  max_tokens=max_tokens_for_early_stop(int(arguments["early_stop_num"])))


def t2s_checks(fixture_dir: Path) -> Iterator[Check]:
    fixture_dir = Path(fixture_dir)
    meta = json.loads((fixture_dir / "cases_meta.json").read_text())
    cases = torch.load(fixture_dir / "cases.pt", map_location="cpu", weights_only=True)
    checkpoint_path = find_gpt_checkpoint(fixture_dir)
    model = load_t2s_checkpoint(checkpoint_path).model
    parameters = sum(p.numel() for p in model.parameters())
    expected_parameters = meta.get("checks", {}).get("gpt_num_params", parameters)
    yield Check("t2s.checkpoint", parameters == expected_parameters,
                f"{checkpoint_path.name} loaded strictly, {parameters:,} parameters "
                f"(reference {expected_parameters:,})")
    sampling = reference_sampling(meta)
    case_names = sorted({key.split("/")[0] for key in cases})
    for case in case_names:
        if f"{case}/t2s.phoneme_ids" in cases:
            yield from single_case_checks(model, case, cases, sampling)
        elif f"{case}/t2s.x0" in cases:
            text_length = meta.get("cases", {}).get(case, {}).get("max_len")
            yield from batch_case_checks(model, case, cases, sampling, text_length)


def single_case_checks(model: Text2SemanticModel, case: str, cases: dict[str, torch.Tensor],
                       sampling: AutoregressiveSampling) -> Iterator[Check]:
    prefix = f"{case}/t2s."
    decoded = decode(model, cases[prefix + "phoneme_ids"], cases[prefix + "bert_feature"],
                     cases.get(prefix + "prompt_semantic"), sampling, record_logits=True)
    yield exactly_equal(prefix + "infer_panel.y", decoded.y.unsqueeze(0), cases[prefix + "infer_panel.y"])
    yield exactly_equal(prefix + "infer_panel.idx", torch.tensor(decoded.idx), cases[prefix + "infer_panel.idx"])
    if prefix + "pred_semantic" in cases:
        yield exactly_equal(prefix + "pred_semantic", decoded.semantic_for_sovits.view(1, 1, -1),
                            cases[prefix + "pred_semantic"])
    first_steps = cases[prefix + "logits_first3"]  # (1, steps, V)
    yield close_to_peak(prefix + "logits_first3", decoded.step_logits[: first_steps.shape[1]].unsqueeze(0),
                        first_steps)
    if prefix + "logits_all_steps" in cases:
        yield close_to_peak(prefix + "logits_all_steps", decoded.step_logits.unsqueeze(0),
                            cases[prefix + "logits_all_steps"])


def batch_case_checks(model: Text2SemanticModel, case: str, cases: dict[str, torch.Tensor],
                      sampling: AutoregressiveSampling, text_length: int | None) -> Iterator[Check]:
    prefix = f"{case}/t2s."
    batch = int(cases[prefix + "x_lens"].numel())
    decoded = decode_batch(model, [cases[f"{prefix}x{row}"] for row in range(batch)],
                           [cases[f"{prefix}bert{row}"] for row in range(batch)], cases[prefix + "prompts"],
                           sampling, text_length=text_length, record_logits=True)
    for row, result in enumerate(decoded):
        yield exactly_equal(f"{prefix}y{row}", result.y, cases[f"{prefix}y{row}"])
        yield exactly_equal(f"{prefix}idx{row}", torch.tensor(result.idx), cases[f"{prefix}idx{row}"])
    first_steps = cases[prefix + "logits_first3"]  # (B, steps, V)
    steps = first_steps.shape[1]
    ours = [result.step_logits[:steps] for result in decoded]
    if any(logits.shape[0] < steps for logits in ours):
        yield Check(prefix + "logits_first3", False, f"a row stopped before {steps} steps")
        return
    yield close_to_peak(prefix + "logits_first3", torch.stack(ours), first_steps)
