"""Numerical parity of an exported graph in onnxruntime against the PyTorch variant it came from.

    from export.parity import onnx_torch_parity
    onnx_torch_parity(voice, "fp16.onnx", sequences, precision="fp16")
    # {"sentences": 2, "durations_equal_fraction": 1.0, "max_diff_of_peak": 3e-3, "budget_of_peak": 1e-2,
    #  "within_budget": True, "snr_db_min": 48.1, "snr_db_mean": 51.0}

Each sentence runs alone (batch 1) in both engines with the same sampling (seed i for sentence i,
the family's default sampling otherwise), fed to the graph by the family's graph contract
(models/graph_contract.py), which draws the noise the PyTorch model draws. Waveforms are compared
only where every duration agrees (a moved duration shifts all later samples); a graph without a
durations output is compared on every sentence. Budgets relative to the peak: fp32 1e-4, fp16
1e-2; int8 and bf16 have none and are judged by SNR and by the quality metrics the pipeline runs.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from models.graph_contract import SYNTHESIZER, GraphContract
from models.interface import SynthesisRequest, Utterance
from models.precision import waveform_snr_db
from models.registry import family_of
from models.sampling import Sampling

BUDGETS_OF_PEAK = {"fp32": 1e-4, "fp16": 1e-2}
PRECISIONS = ("fp32", "fp16", "bf16", "int8")


def check_requests(model, contract: GraphContract, sequences: Sequence[Utterance],
                   sampling: Sampling | None = None) -> list[SynthesisRequest]:
    """One batch-1 request per sentence, seed i for sentence i, with the contract's example voice."""
    sampling = sampling if sampling is not None else family_of(model).sampling()
    return [SynthesisRequest.from_utterances([sequence], sampling=dataclasses.replace(sampling, seed=index),
                                             voice=contract.example_voice)
            for index, sequence in enumerate(sequences)]


def synthesizer_contract(model) -> GraphContract:
    """The family's end-to-end graph contract (``SYNTHESIZER``): fed from a request, audio out."""
    family = family_of(model)
    contracts = family.graph_contracts(model) if family.graph_contracts is not None else {}
    contract = contracts.get(SYNTHESIZER)
    if contract is None or contract.feeds is None or contract.audio_output is None:
        raise ValueError(f"family {family.name} has no {SYNTHESIZER!r} graph fed from a request with an audio "
                         f"output; its graphs: {sorted(contracts)}")
    return contract


def onnx_torch_parity(model, graph_path: str | Path, sequences: Sequence[Utterance], precision: str = "fp32",
                      threads: int = 1, sampling: Sampling | None = None,
                      contract: GraphContract | None = None) -> dict:
    """JSON-able parity metrics of ``graph_path`` against ``model`` (PyTorch) on ``sequences``.

    ``contract`` is the graph's (default: the family's synthesizer); ``sampling`` the family's default.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {list(PRECISIONS)}")
    if not sequences:
        raise ValueError("onnx_torch_parity needs at least one phoneme sequence")
    contract = contract if contract is not None else synthesizer_contract(model)
    if contract.feeds is None or contract.audio_output is None:
        raise ValueError("onnx_torch_parity needs a contract with feeds and an audio output (a graph fed from a "
                         "request); a part exported alone has neither")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(graph_path), options, providers=["CPUExecutionProvider"])
    output_names = [contract.audio_output] + ([contract.durations_output] if contract.durations_output else [])
    diffs_of_peak, snrs_db, durations_equal = [], [], 0
    for request in check_requests(model, contract, sequences, sampling):
        reference = model.synthesize(request)
        audio, *durations = session.run(output_names, contract.feeds(request))
        if durations and not np.array_equal(durations[0].reshape(1, -1).astype(np.int64),
                                            reference.durations.numpy()):
            continue
        durations_equal += 1
        ours = torch.from_numpy(audio.reshape(-1).astype(np.float32))
        theirs = reference.waveforms()[0]
        peak = float(theirs.abs().max()) or 1.0
        diffs_of_peak.append(float((ours - theirs).abs().max()) / peak)
        snrs_db.append(waveform_snr_db(ours, theirs))
    budget = BUDGETS_OF_PEAK.get(precision)
    max_diff = max(diffs_of_peak) if diffs_of_peak else None
    return {
        "sentences": len(sequences),
        "precision": precision,
        "durations_equal_fraction": durations_equal / len(sequences),
        "max_diff_of_peak": max_diff,
        "budget_of_peak": budget,
        "within_budget": (None if budget is None
                          else bool(durations_equal == len(sequences) and max_diff is not None and max_diff <= budget)),
        "snr_db_min": min(snrs_db) if snrs_db else None,
        "snr_db_mean": sum(snrs_db) / len(snrs_db) if snrs_db else None,
    }
