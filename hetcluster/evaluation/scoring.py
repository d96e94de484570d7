"""Score the planner against measurements: per objective the chosen vs the measured best, and MAPE.

Pure (no TensorFlow, no gRPC): it takes each configuration's predicted and measured JobMetrics and
the planner's choice per objective, so tests and benchmarks can score recorded results.

* ``best`` is the measured configuration with the lowest measured metric of the objective;
* ``exact`` says the planner chose that one; ``regret`` = (measured metric of the chosen −
  measured metric of the best) / best (0 when exact; None when the chosen one was not measured);
* MAPE is mean |predicted − measured| / measured over the measured configurations, for the whole
  job (pre-training included on both sides) and for the training phase alone (pre-training time
  and energy subtracted from both), since the shared pre-training part dilutes the whole-job error.

A configuration trained several times (``evaluate --repeats R``) is measured by the mean of its
runs (``measured``; each run's figures in ``repeats``), and each objective then also says whether
the choice is ``within_noise``: exact, or the chosen configuration's runs and the best one's
overlap on the objective's metric (some run of the chosen measured at least as good as some run
of the best) — the ground truth itself cannot tell the two apart — and whether the truth is
``separated``: every run of the best measured better than every run of every other configuration.
Where it is not, some other configuration's runs overlap the best's and which one is "best"
depends on the training; ``exact`` over the separated cases is the planner's accuracy where the
ground truth is unambiguous. With every configuration trained R ≥ 2 times, round k being each
configuration's k-th run, ``rounds_agree`` says whether every round names the same best, and
``exact_per_round`` is the share of rounds whose best is the choice: the planner scored against one
training of every configuration, beside how often one such training agrees with another (the
ceiling that the truth's own noise puts on any planner's exact rate).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from hetcluster.training.report import METRICS, JobMetrics

OBJECTIVE_METRIC = {"time": "time_s", "power": "power_w", "energy": "energy_j", "edp": "edp_js"}


@dataclass
class ConfigurationResult:
    """One configuration: its devices, the planner's prediction and (unless it failed) the measurement."""

    devices: tuple[str, ...]
    predicted: JobMetrics
    measured: JobMetrics | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    repeats: list[JobMetrics] = field(default_factory=list)  # each run's measurement (when trained more than once)

    def to_dict(self) -> dict[str, Any]:
        data = {"devices": list(self.devices), "predicted": self.predicted.to_dict(),
                "measured": self.measured.to_dict() if self.measured else None}
        if self.error:
            data["error"] = self.error
        if self.repeats:
            data["repeats"] = [m.to_dict() for m in self.repeats]
        data.update(self.details)
        return data


def _key(devices: Sequence[str]) -> frozenset[str]:
    return frozenset(devices)


def score_objective(results: Sequence[ConfigurationResult], objective: str, chosen: Sequence[str],
                    near_ties: Sequence[Sequence[str]] | None = None) -> dict[str, Any]:
    """``{chosen, best, exact, regret, metric}`` for one objective over the measured configurations,
    ``within_noise`` when both the chosen and the best configuration were measured more than once,
    and with the plan's ``near_ties`` (Plan.near_ties) given, those and ``best_among_near_ties``:
    the measured best is the choice or one of the configurations the planner said it could not
    tell from it."""
    metric = OBJECTIVE_METRIC[objective]
    measured = [r for r in results if r.measured is not None]
    if not measured:
        return {"chosen": list(chosen), "best": None, "exact": None, "regret": None, "metric": metric}
    best = min(measured, key=lambda r: getattr(r.measured, metric))
    best_value = getattr(best.measured, metric)
    mine = next((r for r in measured if _key(r.devices) == _key(chosen)), None)
    regret = None if mine is None or best_value <= 0 else (getattr(mine.measured, metric) - best_value) / best_value
    exact = None if mine is None else _key(best.devices) == _key(chosen)
    score = {"chosen": list(chosen), "best": list(best.devices), "exact": exact, "regret": regret, "metric": metric}
    if near_ties is not None:
        score["near_ties"] = [list(t) for t in near_ties]
        score["best_among_near_ties"] = None if exact is None else bool(exact) or any(
            _key(t) == _key(best.devices) for t in near_ties)
    if mine is not None and len(mine.repeats) > 1 and len(best.repeats) > 1:
        score["within_noise"] = bool(exact) or (min(getattr(m, metric) for m in mine.repeats)
                                                <= max(getattr(m, metric) for m in best.repeats))
    separated = truth_separated(measured, metric, best)
    if separated is not None:
        score["separated"] = separated
    bests = round_bests(measured, metric)
    if bests is not None:
        score["rounds_agree"] = len(set(bests)) == 1
        if mine is not None:
            score["exact_per_round"] = sum(b == _key(chosen) for b in bests) / len(bests)
    return score


def round_bests(measured: Sequence[ConfigurationResult], metric: str) -> list[frozenset[str]] | None:
    """The best configuration of each round (round k: every configuration's k-th run), over the
    rounds every configuration has; None unless every configuration was trained more than once."""
    rounds = min((len(r.repeats) for r in measured), default=0)
    if rounds < 2:
        return None
    return [_key(min(measured, key=lambda r: getattr(r.repeats[k], metric)).devices) for k in range(rounds)]


def truth_separated(measured: Sequence[ConfigurationResult], metric: str, best: ConfigurationResult) -> bool | None:
    """Whether every run of ``best`` measured better than every run of every other configuration
    (None unless every configuration was trained more than once)."""
    if any(len(r.repeats) < 2 for r in measured):
        return None
    worst_of_best = max(getattr(m, metric) for m in best.repeats)
    return all(worst_of_best < min(getattr(m, metric) for m in r.repeats) for r in measured if r is not best)


def mape(results: Sequence[ConfigurationResult], pretrain_time_s: float = 0.0,
         pretrain_energy_j: float = 0.0) -> dict[str, float | None]:
    """Mean absolute percentage error per metric (as a fraction) over the measured configurations.

    With ``pretrain_*`` given, those are subtracted from both sides' time and energy first (the
    training phase alone; power is already the training phase's, EDP is recomputed)."""
    rows = [r for r in results if r.measured is not None]
    out: dict[str, float | None] = {}
    for name in METRICS:
        errors = []
        for r in rows:
            guess, truth = (
                _phase(r.predicted, pretrain_time_s, pretrain_energy_j),
                _phase(r.measured, pretrain_time_s, pretrain_energy_j),
            )
            if getattr(truth, name) > 0:
                errors.append(abs(getattr(guess, name) - getattr(truth, name)) / getattr(truth, name))
        out[name] = sum(errors) / len(errors) if errors else None
    return out


def _phase(metrics: JobMetrics, pretrain_time_s: float, pretrain_energy_j: float) -> JobMetrics:
    time_s, energy_j = metrics.time_s - pretrain_time_s, metrics.energy_j - pretrain_energy_j
    return JobMetrics(time_s=time_s, power_w=metrics.power_w, energy_j=energy_j, edp_js=time_s * energy_j)
