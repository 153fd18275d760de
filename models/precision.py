"""Precision islands: run parts of a model in float16 or bfloat16 behind float32 edges.

Light on purpose (torch only), so that evaluate/gpu_benchmark.py builds the half-precision
variants on a bare GPU machine with the same code the compress stage uses:

    from models.precision import part_sensitivity, to_half_precision

    fp16_voice = to_half_precision(voice, "float16", keep_fp32=["duration"])  # a copy; voice is untouched
    fp16_voice.parts()["decoder"]             # PrecisionIsland(HifiGanGenerator, torch.float16)
    part_sensitivity(voice, calibration_sequences, "bfloat16", "cpu")          # one row per part

Every tensor that crosses an island's edge is float32: floating inputs are cast to the island's
dtype on the way in, floating outputs back to float32 on the way out, integer tensors pass
untouched. Parts of different precisions therefore compose without the model knowing, and the
steps between parts (the exp and ceil that turn log-durations into frame counts, the alignment
matmul) stay in float32, where a rounding flip would change a phoneme's length.

``part_sensitivity`` runs each part alone in half precision (the others in float32) on the same
sentences with the same noise as the float32 model, and reports what changed: that table is
what decides which parts a variant keeps in float32 (compress/half_precision.py).
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from models.interface import SynthesisRequest, SynthesisResult, Utterance
from models.sampling import Sampling

HALF_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
VARIANT_NAMES = {"float16": "fp16", "bfloat16": "bf16"}  # what runs and result tables call them
# A waveform equal to the reference has infinite SNR; 120 dB stands for it (float32 rounding
# alone sits near 150 dB, so any half-precision difference reads below the cap).
SNR_CAP_DB = 120.0


def half_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float16"``/``"bfloat16"`` (or the torch dtype itself) -> torch dtype; anything else is a ValueError."""
    if isinstance(name, torch.dtype) and name in HALF_DTYPES.values():
        return name
    if isinstance(name, str) and name in HALF_DTYPES:
        return HALF_DTYPES[name]
    raise ValueError(f"half-precision dtype {name!r} is not supported; use one of {sorted(HALF_DTYPES)}")


def _cast_floating(value, dtype: torch.dtype):
    """Cast floating tensors inside ``value`` (a tensor, tuple, list, dict or anything else) to ``dtype``."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast_floating(item, dtype) for item in value)
    if isinstance(value, dict):
        return type(value)((key, _cast_floating(item, dtype)) for key, item in value.items())
    return value


class PrecisionIsland(nn.Module):
    """Runs ``module`` in ``dtype``; float32 in, float32 out.

    The module's parameters and buffers are converted in place (wrap a copy to keep the
    original). Both entry points of a VITS part are covered: ``forward`` (encoder, duration
    predictor, decoder) and ``reverse`` (the flow at inference). The wrapped weights appear in
    state dicts under ``<part>.module.``.
    """

    def __init__(self, module: nn.Module, dtype: str | torch.dtype):
        super().__init__()
        self.dtype = half_dtype(dtype)
        self.module = module.to(self.dtype)

    def forward(self, *args, **kwargs):
        return self._run(self.module, args, kwargs)

    def reverse(self, *args, **kwargs):
        return self._run(self.module.reverse, args, kwargs)

    def __getattr__(self, name: str):
        """Other entry points of the wrapped part (a style encoder's ``pooled``) run in ``dtype`` too;
        its other attributes (sub-modules, configs) are the part's own."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            attribute = getattr(self._modules["module"], name)
        if callable(attribute) and not isinstance(attribute, nn.Module):
            return lambda *args, **kwargs: self._run(attribute, args, kwargs)
        return attribute

    def _run(self, entry_point: Callable, args: tuple, kwargs: dict):
        inside_args = _cast_floating(args, self.dtype)
        inside_kwargs = {name: _cast_floating(value, self.dtype) for name, value in kwargs.items()}
        return _cast_floating(entry_point(*inside_args, **inside_kwargs), torch.float32)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}"


def to_half_precision(voice_or_model, dtype: str | torch.dtype, keep_fp32: Sequence[str] = ()):
    """A copy of ``voice_or_model`` whose parts run in ``dtype``, except the roles in ``keep_fp32``.

    ``voice_or_model``: anything with ``parts()`` and ``replace_part(role, module)`` (a family's model
    or its synthesizer module); the argument itself is not changed. Parts are swapped only through that
    interface, so the copy keeps the model's own forward.
    """
    dtype = half_dtype(dtype)
    roles = list(voice_or_model.parts())
    unknown = sorted(set(keep_fp32) - set(roles))
    if unknown:
        raise ValueError(f"keep_fp32 names unknown parts {unknown}; this model's parts are {roles}")
    converted = copy.deepcopy(voice_or_model)
    for role, part in converted.parts().items():
        if role not in keep_fp32:
            converted.replace_part(role, PrecisionIsland(part, dtype))
    return converted


def synthesize_each(voice, sequences: Sequence[Utterance], noises: Sequence[Sampling]) -> list[SynthesisResult]:
    """Batch-1 synthesis of every sequence with its own noise, results on the CPU."""
    results = []
    for sequence, noise in zip(sequences, noises, strict=True):
        result = voice.synthesize(SynthesisRequest.from_utterances([sequence], sampling=noise))
        results.append(SynthesisResult(
            result.audio.float().cpu(), result.audio_lengths.cpu(), result.sample_rate_hz,
            durations=None if result.durations is None else result.durations.cpu(),
            tokens=None if result.tokens is None else result.tokens.cpu()))
    return results


def waveform_snr_db(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    """10 log10(reference energy / difference energy) of two (T,) waveforms, capped at SNR_CAP_DB."""
    signal_energy = float(reference.double().pow(2).sum())
    error_energy = float((candidate.double() - reference.double()).pow(2).sum())
    if error_energy <= signal_energy * 10 ** (-SNR_CAP_DB / 10):
        return SNR_CAP_DB
    return 10 * math.log10(signal_energy / error_energy)


def _units(result: SynthesisResult) -> torch.Tensor:
    """What a family decides before the waveform: frames per phoneme, else semantic tokens."""
    if result.durations is not None:
        return result.durations
    if result.tokens is None:
        raise ValueError("a result with neither durations nor tokens cannot be compared unit by unit")
    return result.tokens


def compare_outputs(
    candidate: Sequence[SynthesisResult],
    reference: Sequence[SynthesisResult],
    mcd_db: Callable[[torch.Tensor, torch.Tensor, int], float] | None = None,
) -> dict:
    """How far batch-1 outputs moved from the reference's, utterance by utterance.

    Durations are compared phoneme by phoneme; the waveform SNR only where they all agree (a
    changed duration shifts every later sample, so SNR would measure the shift, not the noise).
    An autoregressive family has no durations: its semantic tokens play their part (the
    ``durations_*`` keys then count changed tokens, ``frames_moved_max`` changed token positions).
    ``mcd_db(test, reference, sample_rate_hz)`` (evaluate.mcd.mel_cepstral_distortion) aligns
    by DTW, so it covers every utterance; None leaves ``mcd_db`` out (a machine without librosa).
    """
    changed, phonemes_changed, phonemes, frames_moved, snrs_db, mcds_db = 0, 0, 0, 0, [], []
    for ours, theirs in zip(candidate, reference, strict=True):
        our_units, their_units = _units(ours), _units(theirs)
        phonemes += their_units.numel()
        if not torch.equal(our_units, their_units):
            changed += 1
            if theirs.durations is not None:
                phonemes_changed += int((our_units != their_units).sum())
                frames_moved = max(frames_moved, int((our_units - their_units).abs().sum()))
            else:  # token sequences may differ in length: positions past the shorter one all changed
                shared = min(our_units.numel(), their_units.numel())
                moved = int((our_units.flatten()[:shared] != their_units.flatten()[:shared]).sum())
                moved += max(our_units.numel(), their_units.numel()) - shared
                phonemes_changed += moved
                frames_moved = max(frames_moved, moved)
        else:
            snrs_db.append(waveform_snr_db(ours.waveforms()[0], theirs.waveforms()[0]))
        if mcd_db is not None:
            mcds_db.append(mcd_db(ours.waveforms()[0], theirs.waveforms()[0], theirs.sample_rate_hz))
    row = {
        "utterances": len(reference),
        "durations_changed_fraction": changed / len(reference),  # utterances with any phoneme's duration changed
        "phonemes_changed_fraction": phonemes_changed / phonemes,
        "frames_moved_max": frames_moved,  # worst utterance: sum over phonemes of |frames - reference frames|
        "snr_db_mean": sum(snrs_db) / len(snrs_db) if snrs_db else None,
        "snr_db_min": min(snrs_db) if snrs_db else None,
    }
    if mcd_db is not None:
        row["mcd_db"] = sum(mcds_db) / len(mcds_db)
    return row


def part_sensitivity(
    voice,
    sequences: Sequence[Utterance],
    dtype: str | torch.dtype,
    device: str,
    noises: Sequence[Sampling] | None = None,
    mcd_db: Callable[[torch.Tensor, torch.Tensor, int], float] | None = None,
) -> list[dict]:
    """One row per part: that part alone in ``dtype``, every other part in float32, vs all float32.

    ``voice``: the float32 model (an nn.Module with ``parts``/``replace_part``/``synthesize``); it
    is copied to ``device``, not moved. ``noises``: one per sequence; by default the model's own
    sampling type with seed i for sequence i, the same for every row and the reference.
    """
    dtype = half_dtype(dtype)
    noises = list(noises) if noises is not None else [voice.sampling_type(seed=i) for i in range(len(sequences))]
    reference = synthesize_each(copy.deepcopy(voice).to(device), sequences, noises)
    rows = []
    for role in voice.parts():
        others = [other for other in voice.parts() if other != role]
        candidate = to_half_precision(voice, dtype, keep_fp32=others).to(device)
        outputs = synthesize_each(candidate, sequences, noises)
        rows.append({"part": role, "dtype": str(dtype).removeprefix("torch."), "device": device,
                     **compare_outputs(outputs, reference, mcd_db)})
    return rows
