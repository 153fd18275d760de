"""Numerical parity of an exported graph in onnxruntime against the PyTorch variant it came from.

    from export.parity import onnx_torch_parity
    onnx_torch_parity(voice, "fp16.onnx", sequences, precision="fp16")
    # {"sentences": 2, "durations_equal_fraction": 1.0, "max_diff_of_peak": 3e-3, "budget_of_peak": 1e-2,
    #  "within_budget": True, "snr_db_min": 48.1, "snr_db_mean": 51.0}

Each sentence runs alone (batch 1) in both engines with the same noise tensors (seed i for
sentence i, Piper's scales). Waveforms are compared only where every duration agrees (a moved
duration shifts all later samples). Budgets relative to the peak: fp32 1e-4, fp16 1e-2 (issue #4);
int8 and bf16 have none and are judged by SNR and by the quality metrics the pipeline runs.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from models.interface import SynthesisRequest, Utterance
from models.sampling import VitsSampling
from models.precision import waveform_snr_db

BUDGETS_OF_PEAK = {"fp32": 1e-4, "fp16": 1e-2}
PRECISIONS = ("fp32", "fp16", "bf16", "int8")


def onnx_torch_parity(voice, graph_path: str | Path, sequences: Sequence[Utterance], precision: str = "fp32",
                      threads: int = 1, noise: VitsSampling = VitsSampling()) -> dict:
    """JSON-able parity metrics of ``graph_path`` against ``voice`` (a PyTorch PiperVoice) on ``sequences``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {list(PRECISIONS)}")
    if not sequences:
        raise ValueError("onnx_torch_parity needs at least one phoneme sequence")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(graph_path), options, providers=["CPUExecutionProvider"])
    input_names = {graph_input.name for graph_input in session.get_inputs()}
    latent_channels = voice.model.hp.latent_channels
    diffs_of_peak, snrs_db, durations_equal = [], [], 0
    for index, sequence in enumerate(sequences):
        drawn = VitsSampling(noise.noise_scale, noise.length_scale, noise.noise_scale_w, seed=index)
        duration_noise, prior_noise = drawn.draw(1, len(sequence.phoneme_ids), latent_channels)
        fixed = VitsSampling(noise.noise_scale, noise.length_scale, noise.noise_scale_w, seed=index,
                             duration_noise=duration_noise, prior_noise=prior_noise)
        request = SynthesisRequest.from_utterances([sequence], sampling=fixed)
        reference = voice.synthesize(request)
        feeds = {
            "input": request.phoneme_ids.numpy(), "input_lengths": request.phoneme_lengths.numpy(),
            "scales": np.array([noise.noise_scale, noise.length_scale, noise.noise_scale_w], np.float32),
            "duration_noise": duration_noise.numpy(), "prior_noise": prior_noise.numpy(),
        }
        if "sid" in input_names:
            feeds["sid"] = np.zeros(1, np.int64)
        audio, durations = session.run(["output", "durations"], feeds)
        if not np.array_equal(durations.reshape(1, -1).astype(np.int64), reference.durations.numpy()):
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
