"""evaluate/gpu_results.py: several H200 engines calls merge into one report, wrong rows dropped by name."""
from __future__ import annotations

import pytest

from evaluate.gpu_results import (CALL_STUDENTS_KEY, ROW_STUDENTS_KEY, VARIANT_STUDENTS_KEY, combine_engine_calls,
                                  merge)


def _call(rows: dict, utterances: int = 100, students: dict[str, str] | None = None) -> dict:
    call = {"machine": {"gpu": "NVIDIA H200"}, "utterances": utterances, "eval_set": "harvard", "engines": rows}
    return call if students is None else call | {CALL_STUDENTS_KEY: students}


def _figures(row: dict) -> dict:
    return {key: value for key, value in row.items() if key != ROW_STUDENTS_KEY}


def _row(rtf_b1: float) -> dict:
    return {"rtf_cuda_b1": rtf_b1, "rtf_cuda_b16": rtf_b1 / 8, "latency_first_audio_ms_cuda": 1000 * rtf_b1}


def test_later_calls_win_and_drops_apply_per_call():
    first = _call({"teacher/eager": _row(0.010), "lite/compile": _row(0.006)})
    second = _call({"teacher/eager": _row(0.008), "lite/compile": _row(0.003),
                    "lite/aoti": {"error": "UserError"}})
    combined = combine_engine_calls([first, second], drop=("2:lite/compile",))
    assert _figures(combined["engines"]["teacher/eager"]) == _row(0.008)  # the later call
    assert _figures(combined["engines"]["lite/compile"]) == _row(0.006)  # the second call's row was dropped
    assert "lite/compile" not in combine_engine_calls([first, second], drop=("lite/compile",))["engines"]
    merged = merge({"variants": {"teacher": {"vram_peak_mib": 140.0}}}, combined)
    assert merged["variants"]["lite"]["rtf_cuda_b1_compile"] == 0.006
    assert merged["variants"]["teacher"]["vram_peak_mib"] == 140.0
    assert merged["variants"]["teacher"]["rtf_cuda_b1"] == merged["variants"]["teacher"]["rtf_cuda_b1_eager"] == 0.008
    assert "rtf_cuda_b1_aoti" not in merged["variants"]["lite"]  # error rows carry no figures


def test_spreads_of_a_call_in_rounds_travel_with_their_figures():
    timed_in_rounds = {**_row(0.008), "rtf_cuda_b1_spread": 0.002}
    merged = merge({"variants": {}}, _call({"teacher/eager": timed_in_rounds, "lite_fp16/compile": timed_in_rounds}))
    assert merged["variants"]["teacher"]["rtf_cuda_b1_spread"] == 0.002
    assert merged["variants"]["teacher"]["rtf_cuda_b1_eager_spread"] == 0.002
    assert merged["variants"]["lite"]["rtf_cuda_b1_compile_fp16_spread"] == 0.002
    assert "rtf_cuda_b16_spread" not in merged["variants"]["teacher"]  # none measured, none invented


def test_bad_merges_are_refused():
    with pytest.raises(ValueError, match="no call has"):
        combine_engine_calls([_call({"teacher/eager": {}})], drop=("3:teacher/eager",))
    with pytest.raises(ValueError, match="different sentence counts"):
        combine_engine_calls([_call({}, 100), _call({}, 50)])
    with pytest.raises(ValueError, match="at least one"):
        combine_engine_calls([])


def test_a_variant_keeps_only_the_students_every_call_feeding_it_was_given():
    """One Lite row from a call given another student, or from a call that recorded none, empties the
    variant's set (so the pipeline withholds it) and is listed with every row's students."""
    gan = _call({"teacher/eager": _row(0.008), "lite/eager": _row(0.006)}, students={"lite.safetensors": "aa"})
    same = _call({"lite_fp16/compile": _row(0.002)}, students={"lite.safetensors": "aa", "duration.safetensors": "dd"})
    spectral = _call({"lite_fp16/compile": _row(0.002)}, students={"lite.safetensors": "bb"})
    unrecorded = _call({"lite_fp16/compile": _row(0.002)})
    agreed = merge({"variants": {}}, combine_engine_calls([gan, same]))
    assert agreed[VARIANT_STUDENTS_KEY] == {"teacher": ["aa"], "lite": ["aa"]}
    # The duration student was given to one of the two calls only: listed, the acoustic student kept.
    assert agreed["student_disagreements"] == {"lite": {"partial_students": ["dd"], "rows": {
        "lite/eager": ["aa"], "lite_fp16/compile": ["aa", "dd"]}}}
    for other in (spectral, unrecorded):
        combined = combine_engine_calls([gan, other])
        assert CALL_STUDENTS_KEY not in combined  # the last call's students travel on its rows only
        merged = merge({"variants": {}}, combined)
        assert merged[VARIANT_STUDENTS_KEY]["lite"] == []
        assert "aa" in merged["student_disagreements"]["lite"]["partial_students"]
        assert set(merged["student_disagreements"]["lite"]["rows"]) == {"lite/eager", "lite_fp16/compile"}
