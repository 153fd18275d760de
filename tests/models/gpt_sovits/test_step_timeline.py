"""The persistent step's timeline: a stamp table of known timing read back into phases."""
from __future__ import annotations

import numpy as np
import pytest

from models.gpt_sovits.step_timeline import StepLayout, phase_rows, summarize

ROLES = ["chunk", "key", "idle"]
RELEASE, SKEW, PARTIAL, OUT_PROJECTION, AFTER, FFN_WORK = 100, 10, 50, 200, 30, 70


def scheduled_stamps(layout: StepLayout) -> np.ndarray:
    """Stamps of a made-up step: every barrier releases RELEASE ns after its last arrival, program p
    SKEW x p later; in the attend phase program 1 (the key program) is its head's last arrival and
    adds the out projection; every other phase takes FFN_WORK ns a program."""
    stamps = np.zeros((layout.events, layout.programs), dtype=np.int64)
    programs = np.arange(layout.programs)
    arrived = np.array([1_000, 1_020, 1_005])  # the first barrier's arrivals: skewed starts
    for barrier in range(1, layout.barriers + 1):
        stamps[layout.arrival(barrier)] = arrived
        released = arrived.max() + RELEASE + SKEW * programs
        stamps[layout.release(barrier)] = released
        name, layer = layout.phase_of(barrier)
        if name == "attend":
            partial = released + PARTIAL
            done = partial + np.where(programs == 1, OUT_PROJECTION, 0)
            stamps[layout.partial_written(layer)] = partial
            stamps[layout.attend_done(layer)] = done
            finished = done + AFTER
        else:
            finished = released + FFN_WORK
        arrived = finished
    stamps[layout.end] = arrived
    return stamps


def test_the_summary_splits_each_phase_into_release_wait_and_the_critical_programs_work():
    layout = StepLayout(layers=2, phase_names=("attend", "ffn"), programs=3)
    assert layout.barriers == 5 and layout.events == 15
    summary = summarize(scheduled_stamps(layout), layout, ROLES)
    attend, ffn, logits = (summary["phases"][name] for name in ("attend", "ffn", "logits"))
    assert attend["count"] == 2 and ffn["count"] == 2 and logits["count"] == 1
    # The key program (1) arrives last after the attend phase: it waited SKEW after the first release.
    assert attend["critical_roles"] == {"key": 2}
    assert attend["median_release_ns"] == RELEASE and attend["median_release_spread_ns"] == 2 * SKEW
    assert attend["median_wait_ns"] == SKEW
    assert attend["median_work_ns"] == PARTIAL + OUT_PROJECTION + AFTER
    assert (attend["median_partial_ns"], attend["median_out_projection_ns"], attend["median_after_ns"]) == (
        PARTIAL, OUT_PROJECTION, AFTER)
    assert attend["median_span_ns"] == RELEASE + SKEW + PARTIAL + OUT_PROJECTION + AFTER
    # In the FFN phase every program works as long, so the last released (2, idle in attend) is critical.
    assert ffn["critical_roles"] == {"idle": 2} and ffn["median_wait_ns"] == 2 * SKEW
    assert ffn["median_span_ns"] == RELEASE + 2 * SKEW + FFN_WORK
    spans = sum(row["span_ns"] for row in summary["rows"])
    assert summary["step_ns"] == spans + (1_020 - 1_000)  # plus the first barrier's arrival skew
    assert summary["timer_resolution_ns"] == 5


def test_a_table_of_the_wrong_shape_or_roles_is_refused():
    layout = StepLayout(layers=2, phase_names=("attend", "ffn"), programs=3)
    stamps = scheduled_stamps(layout)
    with pytest.raises(ValueError, match="layout expects"):
        phase_rows(stamps[:-1], layout, ROLES)
    with pytest.raises(ValueError, match="2 roles for 3 programs"):
        phase_rows(stamps, layout, ROLES[:2])


def test_unfolded_layers_name_every_phase():
    layout = StepLayout(layers=3, phase_names=("attend", "out", "ffn1", "ffn2"), programs=3)
    names = [layout.phase_of(barrier) for barrier in range(1, layout.barriers + 1)]
    assert names[:5] == [("attend", 0), ("out", 0), ("ffn1", 0), ("ffn2", 0), ("attend", 1)]
    assert names[-1] == ("logits", 3) and len(names) == 13
