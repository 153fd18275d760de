"""Pick the champion variant of a run by an explicit rule: constraints, then one objective.

The rule is data (conf/selection/default.yaml -> ``SelectionSettings``):

1. constraints, relative to the reference row (``dnsmos_p808 >= teacher - 0.1``) or absolute
   (``spk_sim >= 0.9``); a variant missing a constrained metric is ineligible, with that reason;
2. one objective metric and direction (``minimize rtf_cuda_b1``) with an explicit fallback chain
   (``rtf_cpu_b1``): of the chain, the metric that the most variants passing the constraints have
   (the earlier one on equal counts); variants are never ranked on two different metrics, and one
   without the chosen metric is ineligible, with that reason;
3. equal objectives are broken by ``tie_breakers``, then by the order of the rows (the order the run
   scored them: the reference first).

The pipeline calls it after every variant is scored (``python -m compress +experiment=full``);
compress/registration.py logs the decision and registers the champion's graph. For a reviewer:

    from compress.selection import select_champion, pareto_figure
    selection = select_champion(rows, settings.selection, reference_name="teacher")
    pareto_figure(rows, x=selection.objective_metric, y="dnsmos_p808", champion=selection.champion)
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from core.config import ConfigError

if TYPE_CHECKING:  # matplotlib is heavy: it loads only when pareto_figure draws
    from matplotlib.figure import Figure

DIRECTIONS = ("minimize", "maximize")
BOUND_SLACK = 1e-9  # bounds are inclusive; float rounding of `reference + offset` must not flip a boundary
ERROR_RATES = {"word": "wer", "char": "cer"}  # the recognition error rate a voice is scored in, by unit
SPREAD_SUFFIX = "_spread"  # rtf_cpu_b1_spread: max - min of rtf_cpu_b1 over interleaved rounds


def _check_keys(values: object, cls: type, where: str) -> dict:
    if isinstance(values, cls):
        return asdict(values)
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping, got {values!r}")
    accepted = sorted(cls.__dataclass_fields__)
    unknown = sorted(set(values) - set(accepted))
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; accepted: {accepted}")
    return values


def _check_direction(direction: str, where: str) -> None:
    if direction not in DIRECTIONS:
        raise ConfigError(f"{where}={direction!r}: use one of {list(DIRECTIONS)}")


@dataclass(frozen=True)
class ObjectiveSettings:
    metric: str = "rtf_cuda_b1"
    direction: str = "minimize"
    fallbacks: tuple[str, ...] = ("rtf_cpu_b1",)

    def __post_init__(self):
        _check_direction(self.direction, "selection.objective.direction")
        object.__setattr__(self, "fallbacks", tuple(self.fallbacks))
        chain = self.chain
        if len(set(chain)) != len(chain):
            raise ConfigError(f"selection.objective: metric and fallbacks repeat a name: {list(chain)}")

    @property
    def chain(self) -> tuple[str, ...]:
        return (self.metric, *self.fallbacks)


@dataclass(frozen=True)
class Constraint:
    """``metric >= at_least`` or ``metric <= at_most``; relative: the bound is reference + offset."""

    metric: str
    at_least: float | None = None
    at_most: float | None = None
    relative_to_reference: bool = False
    # A variant without the metric passes: for checks only some variants have (an exported graph's
    # parity, a stage's changed durations), where a missing figure means "not applicable".
    when_measured: bool = False

    def __post_init__(self):
        if (self.at_least is None) == (self.at_most is None):
            raise ConfigError(f"selection.constraints[{self.metric}]: give exactly one of at_least, at_most")
        if not isinstance(self.when_measured, bool):
            raise ConfigError(f"selection.constraints[{self.metric}].when_measured={self.when_measured!r}: "
                              "must be true or false")
        if not isinstance(self.relative_to_reference, bool):
            raise ConfigError(f"selection.constraints[{self.metric}].relative_to_reference="
                                f"{self.relative_to_reference!r}: must be true or false")

    def text(self, reference_name: str) -> str:
        op, bound = (">=", self.at_least) if self.at_least is not None else ("<=", self.at_most)
        where = " where measured" if self.when_measured else ""
        if not self.relative_to_reference:
            return f"{self.metric} {op} {bound:g}{where}"
        return f"{self.metric} {op} {reference_name} {'-' if bound < 0 else '+'} {abs(bound):g}{where}"

    def check(self, metrics: dict[str, float], reference: dict[str, float], reference_name: str) -> str:
        """"" when the constraint holds, else why not (the reason names the metric and the numbers)."""
        value = _finite(metrics, self.metric)
        if value is None:
            return "" if self.when_measured and self.metric not in metrics else f"no {self.metric}"
        offset = self.at_least if self.at_least is not None else self.at_most
        bound = offset
        if self.relative_to_reference:
            reference_value = _finite(reference, self.metric)
            if reference_value is None:
                return f"reference {reference_name!r} has no {self.metric}"
            bound = reference_value + offset
        holds = value >= bound - BOUND_SLACK if self.at_least is not None else value <= bound + BOUND_SLACK
        return "" if holds else f"{self.metric} {value:.4g} fails {self.text(reference_name)} (= {bound:.4g})"


@dataclass(frozen=True)
class TieBreaker:
    metric: str
    direction: str = "minimize"

    def __post_init__(self):
        _check_direction(self.direction, f"selection.tie_breakers[{self.metric}].direction")


@dataclass(frozen=True)
class RegistrySettings:
    # None: named after the run, tts-compress-<family>-<voice name> (``model_name_for``), so each
    # voice of each family keeps its own versions.
    model_name: str | None = None
    alias: str = "champion"

    def __post_init__(self):
        if self.model_name == "" or not self.alias:
            raise ConfigError(f"selection.registry: model_name and alias must be non-empty, got {self}")

    def model_name_for(self, family: str, voice: str) -> str:
        """``model_name``, or the name derived from the run's family and voice: the voice's last
        path segment without its suffix ("bundled:joe" -> joe, "voices/en_US-amy.onnx" -> en-us-amy)."""
        if self.model_name is not None:
            return self.model_name
        voice_name = re.split(r"[:/\\]", voice)[-1].removesuffix(".json").removesuffix(".onnx")
        slug = re.sub(r"[^a-z0-9]+", "-", f"{family}-{voice_name}".lower()).strip("-")
        return f"tts-compress-{slug}"


@dataclass(frozen=True)
class SelectionSettings:
    """conf/selection/default.yaml; the defaults here are that file's values (a test keeps them equal)."""

    objective: ObjectiveSettings = field(default_factory=ObjectiveSettings)
    constraints: tuple[Constraint, ...] = (
        Constraint("dnsmos_p808", at_least=-0.1, relative_to_reference=True),
        Constraint("wer", at_most=0.02, relative_to_reference=True),
        Constraint("cer", at_most=0.02, relative_to_reference=True, when_measured=True),
        Constraint("spk_sim", at_least=0.90),
        Constraint("parity_within_budget", at_least=1, when_measured=True),
        Constraint("calib_durations_changed_fraction", at_most=0.0, when_measured=True),
    )
    tie_breakers: tuple[TieBreaker, ...] = (TieBreaker("size_mb", "minimize"),)
    # The reference scored against itself: the pipeline logs MCD and speaker similarity only for the others.
    reference_self_scores: dict[str, float] = field(default_factory=lambda: {"mcd_db": 0.0, "spk_sim": 1.0})
    registry: RegistrySettings = field(default_factory=RegistrySettings)
    manifest_dir: str = "champion"  # under paths.output_dir, one folder per family (champion_dir)

    def for_error_unit(self, unit: str) -> SelectionSettings:
        """The rule a voice scored in ``unit`` ("word" or "char", evaluate.asr.error_unit) is held to:
        constraints on the other unit's error rate are left out, since its runs never measure it (a
        Mandarin voice has no WER, and would otherwise be ineligible on every variant), and those on
        its own error rate bind whether or not they say ``when_measured``."""
        if unit not in ERROR_RATES:
            raise ValueError(f"error unit {unit!r}: use one of {sorted(ERROR_RATES)}")
        measured = ERROR_RATES[unit]
        kept = tuple(replace(c, when_measured=False) if c.metric == measured else c
                     for c in self.constraints if c.metric == measured or c.metric not in ERROR_RATES.values())
        return replace(self, constraints=kept)

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("objective", ObjectiveSettings(**_check_keys(self.objective, ObjectiveSettings, "selection.objective")))
        set_("registry", RegistrySettings(**_check_keys(self.registry, RegistrySettings, "selection.registry")))
        set_("constraints", tuple(
            Constraint(**_check_keys(c, Constraint, f"selection.constraints[{i}]"))
            for i, c in enumerate(self.constraints)))
        set_("tie_breakers", tuple(
            TieBreaker(**_check_keys(t, TieBreaker, f"selection.tie_breakers[{i}]"))
            for i, t in enumerate(self.tie_breakers)))
        if not isinstance(self.reference_self_scores, dict) or not all(
                isinstance(v, (int, float)) for v in self.reference_self_scores.values()):
            raise ConfigError(f"selection.reference_self_scores={self.reference_self_scores!r}: "
                                "a mapping metric -> number")
        if not self.manifest_dir or "/" in self.manifest_dir or self.manifest_dir in (".", ".."):
            raise ConfigError(f"selection.manifest_dir={self.manifest_dir!r}: one folder name under paths.output_dir")

    def champion_dir(self, output_dir: str | Path, family: str) -> Path:
        """``<output_dir>/<manifest_dir>/<family>``: where a run of ``family`` writes its champion, so
        two families' runs keep their own; conf/serve's manifest_path reads the same folder."""
        return Path(output_dir) / self.manifest_dir / family

    def rule_text(self, reference_name: str) -> str:
        objective = f"{self.objective.direction} {self.objective.metric}"
        if self.objective.fallbacks:
            objective += (f" (or {', '.join(self.objective.fallbacks)}: of these, the one most eligible variants "
                          "have, the earlier on equal counts)")
        constraints = "; ".join(c.text(reference_name) for c in self.constraints) or "none"
        ties = ", ".join(f"{t.direction} {t.metric}" for t in self.tie_breakers)
        return (f"eligible: {constraints}. champion: {objective}; a lead within the larger of two variants' "
                f"spreads ({SPREAD_SUFFIX}) is a tie. ties: {ties + ', then ' if ties else ''}the order the run "
                "scored them.")


@dataclass(frozen=True)
class Eligibility:
    eligible: bool
    reasons: tuple[str, ...] = ()  # every failed constraint or missing metric; empty when eligible


@dataclass(frozen=True)
class Selection:
    champion: str | None  # None when no variant is eligible
    objective_metric: str | None  # the metric of the objective chain actually ranked on
    ranking: tuple[str, ...]  # eligible variants, best first
    eligibility: dict[str, Eligibility]
    rule: str
    reference: str
    rows: dict[str, dict[str, float]]

    def to_json(self) -> dict:
        return {"champion": self.champion, "objective_metric": self.objective_metric, "ranking": list(self.ranking),
                "rule": self.rule, "reference": self.reference,
                "eligibility": {name: {"eligible": e.eligible, "reasons": list(e.reasons)}
                                for name, e in self.eligibility.items()},
                "rows": self.rows}


def _finite(metrics: dict[str, float], name: str) -> float | None:
    value = metrics.get(name)
    if value is None or not math.isfinite(float(value)):
        return None
    return float(value)


def _better(a: float, b: float, direction: str) -> bool:
    return a < b if direction == "minimize" else a > b


def select_champion(rows: dict[str, dict[str, float]], settings: SelectionSettings,
                    reference_name: str) -> Selection:
    """Apply ``settings``' rule to ``rows`` ({variant: metrics}, in the order the run scored them)."""
    if reference_name not in rows:
        raise ValueError(f"select_champion: reference {reference_name!r} is not among the rows {list(rows)}")
    rows = {name: dict(metrics) for name, metrics in rows.items()}
    for metric, value in settings.reference_self_scores.items():
        rows[reference_name].setdefault(metric, float(value))
    reference = rows[reference_name]
    reasons = {name: [r for c in settings.constraints if (r := c.check(metrics, reference, reference_name))]
               for name, metrics in rows.items()}
    qualified = [name for name in rows if not reasons[name]]

    # The chain's metric that the most qualified variants have (the earlier one on equal counts);
    # a qualified variant without it cannot be ranked with the others and becomes ineligible.
    counts = [sum(_finite(rows[n], m) is not None for n in qualified) for m in settings.objective.chain]
    objective = settings.objective.chain[counts.index(max(counts))] if qualified and max(counts) else None
    for name in qualified:
        if objective is None:
            reasons[name].append(f"no objective metric (any of {list(settings.objective.chain)})")
        elif _finite(rows[name], objective) is None:
            reasons[name].append(f"no {objective} (the objective)")
    ranking = _rank([n for n in rows if not reasons[n]], rows, objective, settings) if objective else []
    return Selection(
        champion=ranking[0] if ranking else None,
        objective_metric=objective,
        ranking=tuple(ranking),
        eligibility={name: Eligibility(not reasons[name], tuple(reasons[name])) for name in rows},
        rule=settings.rule_text(reference_name),
        reference=reference_name,
        rows=rows,
    )


def spread_of(metrics: dict[str, float], metric: str) -> float:
    """How far repeated measurements of ``metric`` spread (``<metric>_spread``, max - min over
    interleaved rounds); 0 where the figure was measured once."""
    return _finite(metrics, f"{metric}{SPREAD_SUFFIX}") or 0.0


def _rank(names: list[str], rows: dict[str, dict[str, float]], objective: str,
          settings: SelectionSettings) -> list[str]:
    """Best first. A variant beats another on the objective only by more than the larger of their
    spreads: the variants within that distance of the best are tied with it, and the tie-breakers
    (a variant lacking one comes after), then the run's order, decide among them. The others follow,
    ranked the same way."""
    def tie_key(name: str) -> tuple:
        parts = []
        for tie in settings.tie_breakers:
            value = _finite(rows[name], tie.metric)
            parts.append((value is None, 0.0 if value is None else _signed(value, tie.direction)))
        return tuple(parts)

    remaining = sorted(names, key=lambda n: _signed(rows[n][objective], settings.objective.direction))
    ranking = []
    while remaining:
        best = remaining[0]
        best_value = _signed(rows[best][objective], settings.objective.direction)
        tied = [n for n in remaining if _signed(rows[n][objective], settings.objective.direction) - best_value
                <= max(spread_of(rows[best], objective), spread_of(rows[n], objective)) + BOUND_SLACK]
        tied.sort(key=lambda n: (tie_key(n), names.index(n)))
        ranking += tied
        remaining = [n for n in remaining if n not in tied]
    return ranking


def _signed(value: float, direction: str) -> float:
    return value if direction == "minimize" else -value


def pareto_front(rows: dict[str, dict[str, float]], x: str, y: str, x_direction: str = "minimize",
                 y_direction: str = "maximize") -> list[str]:
    """Variants no other variant beats on both ``x`` and ``y`` (sorted along x, best first).

    Variants lacking either metric are left out. One dominates another when it is at least as good
    on both and better on one; equal points are both on the front.
    """
    for name, direction in (("x_direction", x_direction), ("y_direction", y_direction)):
        if direction not in DIRECTIONS:
            raise ValueError(f"pareto_front: {name}={direction!r}; use one of {list(DIRECTIONS)}")
    points = {n: (_finite(m, x), _finite(m, y)) for n, m in rows.items()}
    points = {n: p for n, p in points.items() if None not in p}

    def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
        no_worse = not _better(b[0], a[0], x_direction) and not _better(b[1], a[1], y_direction)
        return no_worse and (_better(a[0], b[0], x_direction) or _better(a[1], b[1], y_direction))

    front = [n for n, p in points.items() if not any(dominates(q, p) for m, q in points.items() if m != n)]
    return sorted(front, key=lambda n: _signed(points[n][0], x_direction))


def pareto_figure(rows: dict[str, dict[str, float]], x: str = "rtf_cpu_b1", y: str = "dnsmos_p808",
                  size: str | None = "vram_peak_mib", champion: str | None = None,
                  x_direction: str = "minimize", y_direction: str = "maximize") -> Figure:
    """Scatter of every variant with ``x`` and ``y``; marker area follows ``size``, front drawn, champion ringed.

    A variant without ``size`` is drawn hollow and smaller than any measured one. Save with ``fig.savefig(path)``;
    no pyplot state is touched, so it works on servers (Agg) and inline in notebooks.
    """
    from matplotlib.figure import Figure  # lazy: a serving machine has no matplotlib

    front = pareto_front(rows, x, y, x_direction, y_direction)
    plotted = {n: m for n, m in rows.items() if _finite(m, x) is not None and _finite(m, y) is not None}
    sizes = {n: _finite(m, size) for n, m in plotted.items()} if size else {}
    known = [s for s in sizes.values() if s is not None]
    unmeasured_pt2, smallest_pt2, largest_pt2 = 20.0, 40.0, 400.0  # marker areas (points^2)

    def area(name: str) -> float:
        value = sizes.get(name)
        if value is None:
            return unmeasured_pt2
        if max(known) == min(known):
            return (smallest_pt2 + largest_pt2) / 2
        return smallest_pt2 + (value - min(known)) / (max(known) - min(known)) * (largest_pt2 - smallest_pt2)

    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for name, metrics in plotted.items():
        hollow = size is not None and sizes.get(name) is None
        ax.scatter(metrics[x], metrics[y], s=area(name), facecolors="none" if hollow else "tab:blue",
                   edgecolors="tab:blue", alpha=0.8, zorder=3)
        ax.annotate(name, (metrics[x], metrics[y]), textcoords="offset points", xytext=(6, 6), fontsize=9)
    if front:
        ax.plot([plotted[n][x] for n in front], [plotted[n][y] for n in front], "--", color="tab:orange",
                label="Pareto front", zorder=2)
    if champion in plotted:
        ax.scatter(plotted[champion][x], plotted[champion][y], s=area(champion) * 2.5, facecolors="none",
                   edgecolors="tab:red", linewidths=2, label=f"champion: {champion}", zorder=4)
    caption = f"marker area: {size}" + (" (hollow: not measured)" if len(known) < len(plotted) else "") if size else ""
    ax.set(xlabel=f"{x} ({'lower' if x_direction == 'minimize' else 'higher'} is better)",
           ylabel=f"{y} ({'lower' if y_direction == 'minimize' else 'higher'} is better)",
           title=f"variants: {y} against {x}" + (f"\n{caption}" if caption else ""))
    ax.grid(alpha=0.3)
    if front or champion in plotted:
        ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    return fig
