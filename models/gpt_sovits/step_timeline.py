"""Where a persistent T2S decode step's time goes, read from the stamps its kernel writes.

``PersistentT2SEngine(timeline=True)`` makes every program of the step kernel write the GPU's
global nanosecond timer at fixed points into an (events, programs) int64 table:

    rows 2(n - 1), 2(n - 1) + 1   grid barrier n = 1..B: the program's arrival, its release
    rows 2B + 2l, 2B + 2l + 1     layer l's attend phase: the program's softmax partial written;
                                  its attend work done (with its head's out projection when it
                                  was the head's last arrival)
    row 2B + 2L                   the step's end, after the logits

with B = layers x phases a layer + 1 barriers (the last opens the logits phase). Between two
"everyone has arrived" instants a phase costs

    span = release (last arrival -> first program released)
         + wait (first release -> the critical program's release)
         + work (the critical program's release -> its arrival at the next barrier)

where the critical program is the one that arrives last at the next barrier: ``summarize`` gives
these per phase kind as medians over the layers, which says whether the barriers, the spread of
their release, or a role's work is what a step waits for.

    layout = StepLayout(layers=24, phase_names=("attend", "ffn"), programs=132)
    report = summarize(engine.step_timeline().numpy(), layout, engine.program_roles())
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepLayout:
    """Which row of the stamp table holds which event (module docstring)."""

    layers: int
    phase_names: tuple[str, ...]  # the phases of a layer, in order; each opens with a grid barrier
    programs: int

    @property
    def barriers(self) -> int:
        return self.layers * len(self.phase_names) + 1

    @property
    def events(self) -> int:
        return 2 * self.barriers + 2 * self.layers + 1

    def arrival(self, barrier: int) -> int:
        return 2 * (barrier - 1)

    def release(self, barrier: int) -> int:
        return 2 * (barrier - 1) + 1

    def partial_written(self, layer: int) -> int:
        return 2 * self.barriers + 2 * layer

    def attend_done(self, layer: int) -> int:
        return 2 * self.barriers + 2 * layer + 1

    @property
    def end(self) -> int:
        return 2 * self.barriers + 2 * self.layers

    def phase_of(self, barrier: int) -> tuple[str, int]:
        """(phase name, layer) of the phase that grid barrier ``barrier`` opens; the last: ("logits", layers)."""
        if barrier == self.barriers:
            return "logits", self.layers
        layer, kind = divmod(barrier - 1, len(self.phase_names))
        return self.phase_names[kind], layer


def timer_resolution_ns(stamps: np.ndarray) -> int:
    """The smallest step between distinct stamps: the global timer's granularity as this table saw it."""
    distinct = np.unique(stamps)
    return int(np.diff(distinct).min()) if distinct.size > 1 else 0


def phase_rows(stamps: np.ndarray, layout: StepLayout, roles: list[str]) -> list[dict]:
    """One row per grid barrier: the phase it opens and that phase's release, wait and work (ns)."""
    if stamps.shape != (layout.events, layout.programs):
        raise ValueError(f"stamps of shape {stamps.shape}, the layout expects {(layout.events, layout.programs)}")
    if len(roles) != layout.programs:
        raise ValueError(f"{len(roles)} roles for {layout.programs} programs")
    stamps = np.asarray(stamps, dtype=np.int64)  # no copy when the table is int64 already
    rows = []
    for barrier in range(1, layout.barriers + 1):
        name, layer = layout.phase_of(barrier)
        arrived = stamps[layout.arrival(barrier)]  # (programs,)
        released = stamps[layout.release(barrier)]
        finished = stamps[layout.end if barrier == layout.barriers else layout.arrival(barrier + 1)]
        critical = int(np.argmax(finished))
        first_release = int(released.min())
        row = {"phase": name, "layer": layer,
               "span_ns": int(finished.max() - arrived.max()),
               "release_ns": int(first_release - arrived.max()),
               "release_spread_ns": int(released.max() - first_release),
               "wait_ns": int(released[critical] - first_release),
               "work_ns": int(finished[critical] - released[critical]),
               "median_work_ns": float(np.median(finished - released)),
               "critical_program": critical, "critical_role": roles[critical]}
        if name == "attend":
            partial = int(stamps[layout.partial_written(layer), critical])
            done = int(stamps[layout.attend_done(layer), critical])
            row.update(partial_ns=partial - int(released[critical]), out_projection_ns=done - partial,
                       after_ns=int(finished[critical]) - done)
        rows.append(row)
    return rows


def summarize(stamps: np.ndarray, layout: StepLayout, roles: list[str]) -> dict:
    """Per phase kind, the median over its layers of every ``phase_rows`` field and how often each role
    was the critical program; the step's time from the first arrival to the last end; the timer's
    resolution."""
    stamps = np.asarray(stamps, dtype=np.int64)
    rows = phase_rows(stamps, layout, roles)
    kinds: dict[str, dict] = {}
    for name in dict.fromkeys(row["phase"] for row in rows):
        mine = [row for row in rows if row["phase"] == name]
        fields = [key for key, value in mine[0].items() if isinstance(value, (int, float)) and key not in
                  ("layer", "critical_program")]
        kinds[name] = {"count": len(mine), **{f"median_{key}": statistics.median(row[key] for row in mine)
                                               for key in fields},
                       "span_ns_total": sum(row["span_ns"] for row in mine),
                       "critical_roles": dict(Counter(row["critical_role"] for row in mine))}
    step_ns = int(stamps[layout.end].max() - stamps[layout.arrival(1)].min())
    return {"step_ns": step_ns, "timer_resolution_ns": timer_resolution_ns(stamps), "phases": kinds, "rows": rows}
