"""Turn `hetcluster evaluate` results (one JSON per model) into the choice-accuracy tables and figures.

Pure data in, tables out (pandas, matplotlib): the runner (choice_accuracy.py) and the notebook that
renders its results share these functions, and tests feed them hand-made evaluation dicts.

* a choice is *exact* when the planner's configuration is the measured best for the objective;
* it is *within 5%* when its measured regret ((chosen − best) / best of the objective's metric) is
  at most 5% — on a shared 2-core host two configurations often measure within noise of each other;
* with every configuration trained several times (`evaluate --repeats`), it is *within noise* when
  exact or when some run of the chosen configuration measured at least as good as some run of the
  best one (the ground truth cannot separate them); the exact rate is then against the mean;
* with the plan's near-ties recorded (evaluations since commit "near-ties"), a choice is *clear*
  when no other feasible configuration was predicted within the chosen prediction's uncertainty
  (Plan.near_ties); `exact_when_clear` is the exact rate over those cases, and
  `best_among_near_ties` says whether the measured best was the choice or one of its near-ties;
* with a repeated truth, a case is *separated* when every run of the measured best was better than
  every run of every other configuration (scoring.truth_separated); `exact_when_separated` is the
  exact rate where the ground truth is unambiguous (elsewhere which configuration is "best"
  changes from one training to the next, and so would the reference's single measurement);
* with a repeated truth, `exact_vs_one_round` scores the choice against one training of every
  configuration (averaged over the rounds) and `rounds_agree` is how often two such trainings name
  the same best: a planner that knew every configuration's expected cost would score about
  sqrt(rounds_agree) against one round, so the pair is the truth's own ceiling beside the planner;
* MAPE of time and energy is over every measured configuration of the model, whole job
  (`mape`, what a user waits for) and training phase only (`mape_training_phase`);
* the pre-training overhead is pre-training time over the whole measured job of the configuration
  chosen for EDP (evaluate's `pretrain.overhead`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

import pandas as pd

REGRET_TOLERANCE = 0.05
OBJECTIVES = ("time", "power", "energy", "edp")
REFERENCE_SCOPE = "reference paper"   # the summary row of the reference's exact rate (Gu et al., 76.67 %)


def choice_rows(model: str, evaluation: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per objective: chosen, measured best, exact, regret, within 5%."""
    rows = []
    for objective, score in evaluation["objectives"].items():
        regret = score.get("regret")
        rows.append({"model": model, "objective": objective, "chosen": "+".join(score["chosen"]),
                     "best": "+".join(score["best"] or []), "exact": score.get("exact"),
                     "regret": regret,
                     "within_5pct": None if regret is None else bool(regret <= REGRET_TOLERANCE),
                     "within_noise": score.get("within_noise"),
                     "near_ties": len(score["near_ties"]) if "near_ties" in score else None,
                     "best_among_near_ties": score.get("best_among_near_ties"),
                     "separated": score.get("separated"), "exact_per_round": score.get("exact_per_round"),
                     "rounds_agree": score.get("rounds_agree")})
    return rows


def model_row(model: str, setting: Mapping[str, Any], evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """One row per model: the job's setting, its errors and the pre-training overhead."""
    mape, phase, pre = evaluation["mape"], evaluation.get("mape_training_phase", {}), evaluation["pretrain"]
    measured = [c for c in evaluation["configurations"] if c.get("measured")]
    return {"model": model, "input_shape": setting.get("input_shape"), "batch_size": setting.get("batch_size"),
            "total_steps": setting.get("total_steps"), "pretrain_steps": pre.get("steps"),
            "configurations": len(evaluation["configurations"]), "measured": len(measured),
            "mape_time": mape.get("time_s"), "mape_energy": mape.get("energy_j"), "mape_power": mape.get("power_w"),
            "mape_time_training": phase.get("time_s"), "mape_energy_training": phase.get("energy_j"),
            "pretrain_time_s": pre.get("time_s"), "pretrain_overhead": pre.get("overhead"),
            "wall_s": setting.get("wall_s")}


def configuration_rows(model: str, evaluation: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Predicted and measured time/power/energy/EDP of every configuration (the raw material)."""
    rows = []
    for config in evaluation["configurations"]:
        row: dict[str, Any] = {"model": model, "devices": "+".join(config["devices"]),
                               "n_devices": len(config["devices"]), "error": config.get("error")}
        for side in ("predicted", "measured"):
            for key, value in (config.get(side) or {}).items():
                row[f"{side}_{key}"] = value
        rows.append(row)
    return rows


def _rate(series: pd.Series) -> float | None:
    known = series.dropna()
    return float(known.astype(bool).mean()) if len(known) else None


def _clear(part: pd.DataFrame) -> dict[str, Any]:
    """Cases whose plan named no near-tie, and the exact rate over them (None without the record)."""
    clear = part[part["near_ties"] == 0]   # NaN (not recorded) is never 0
    return {"clear_cases": int(len(clear)) if part["near_ties"].notna().any() else None,
            "exact_when_clear": _rate(clear["exact"])}


def _separated(part: pd.DataFrame) -> dict[str, Any]:
    """Cases whose repeated truth separated the best from every other configuration, and the exact
    rate over them (None without a repeated truth)."""
    separated = part[part["separated"].eq(True)]   # None (not recorded) is never True
    return {"separated_cases": int(len(separated)) if part["separated"].notna().any() else None,
            "exact_when_separated": _rate(separated["exact"])}


def _rounds(part: pd.DataFrame) -> dict[str, Any]:
    """The choice against one round of the truth, and how often the rounds agree (None without a
    repeated truth)."""
    per_round = part["exact_per_round"].dropna()
    return {"exact_vs_one_round": float(per_round.mean()) if len(per_round) else None,
            "rounds_agree": _rate(part["rounds_agree"])}


def _scope_row(scope: str, part: pd.DataFrame) -> dict[str, Any]:
    """The accuracy figures of one slice of the choices (an objective, all, or a named group)."""
    return {"scope": scope, "cases": len(part), "exact": _rate(part["exact"]),
            "within_5pct": _rate(part["within_5pct"]), "within_noise": _rate(part["within_noise"]),
            "mean_regret": part["regret"].dropna().mean(), **_clear(part), **_separated(part),
            "best_among_near_ties": _rate(part["best_among_near_ties"]), **_rounds(part)}


def summary_table(choices: pd.DataFrame, models: pd.DataFrame, reference: float,
                  groups: Mapping[str, Collection[str]] | None = None) -> pd.DataFrame:
    """The headline table: per objective and overall, exact and within-5% accuracy beside the reference.
    ``groups``: further scopes, each the choices of a set of models (the ``model`` column) — e.g.
    ``unseen``, the recordings whose fleet and model were chosen before any of their results were seen."""
    rows = [_scope_row(objective, choices[choices["objective"] == objective])
            for objective in OBJECTIVES if objective in set(choices["objective"])]
    rows.append({**_scope_row("all", choices),
                 "mape_time": models["mape_time"].mean(), "mape_energy": models["mape_energy"].mean(),
                 "mape_time_training": models["mape_time_training"].mean(),
                 "mape_energy_training": models["mape_energy_training"].mean(),
                 "pretrain_overhead": models["pretrain_overhead"].mean()})
    rows += [_scope_row(name, choices[choices["model"].isin(members)]) for name, members in (groups or {}).items()]
    rows.append({"scope": REFERENCE_SCOPE, "exact": reference})
    return pd.DataFrame(rows)


def _share(share: float | None, of: float | None, *, out_of: bool = False) -> str:
    """A count and its share of ``of`` cases ("583 (84 %)", or "478 of 510 (94 %)" with ``out_of``)."""
    if pd.isna(share) or pd.isna(of):   # None or NaN: not recorded
        return "–"
    count = f"{round(share * of)} of {int(of)}" if out_of else f"{round(share * of)}"
    return f"{count} ({100 * share:.0f} %)"


def _percent(value: float | None, digits: int = 1) -> str:
    return "–" if pd.isna(value) else f"{100 * value:.{digits}f} %"


MARKDOWN_COLUMNS = ("scope", "cases", "exact", "within the truth's noise", "exact where the truth separates its best",
                    "exact where the plan names no near-tie", "best chosen or a named near-tie", "against one round",
                    "rounds agree", "ceiling √(rounds agree)")
README_COLUMNS = ("scope", "cases", "exact", "exact where the truth separates its best", "against one round")


def _cells(scope: str, row: pd.Series) -> dict[str, str]:
    """Every MARKDOWN_COLUMNS cell of one scope's summary row."""
    cases, agree = row["cases"], row["rounds_agree"]
    return {"scope": scope if scope != "edp" else "EDP", "cases": f"{int(cases)}", "exact": _share(row["exact"], cases),
            "within the truth's noise": _share(row["within_noise"], cases),
            "exact where the truth separates its best": _share(row["exact_when_separated"], row["separated_cases"],
                                                               out_of=True),
            "exact where the plan names no near-tie": _share(row["exact_when_clear"], row["clear_cases"], out_of=True),
            "best chosen or a named near-tie": _share(row["best_among_near_ties"], cases),
            "against one round": _percent(row["exact_vs_one_round"]),
            "rounds agree": _share(agree, cases),
            "ceiling √(rounds agree)": _percent(None if pd.isna(agree) else agree ** 0.5)}


def markdown_table(summary: pd.DataFrame, columns: Sequence[str] = MARKDOWN_COLUMNS, reference: bool = False) -> str:
    """summary_table's counts as a Markdown table: a row for all (bold), each group (e.g. unseen) and
    each objective, every share with its count; *ceiling* is what a planner that knew every
    configuration's expected cost would score against one round (sqrt(rounds_agree)). ``columns``: a
    choice of MARKDOWN_COLUMNS (README_COLUMNS for the README); ``reference``: a last row with the
    reference paper's exact rate."""
    rows = summary.set_index("scope")
    scopes = ["all", *[s for s in rows.index if s not in (*OBJECTIVES, "all", REFERENCE_SCOPE)],
              *[o for o in OBJECTIVES if o in rows.index]]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for scope in scopes:
        cells = _cells(scope, rows.loc[scope])
        shown = [cells[c] if scope != "all" else f"**{cells[c]}**" for c in columns]
        lines.append("| " + " | ".join(shown) + " |")
    if reference and REFERENCE_SCOPE in rows.index:
        cells = {"scope": REFERENCE_SCOPE, "exact": _percent(rows.loc[REFERENCE_SCOPE, "exact"], 2)}
        lines.append("| " + " | ".join(cells.get(c, "") for c in columns) + " |")
    return "\n".join(lines) + "\n"


def tables(runs: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]], reference: float,
           groups: Mapping[str, Collection[str]] | None = None) -> dict[str, pd.DataFrame]:
    """``runs``: (model, setting, evaluation JSON). Returns choices, models, configurations, summary
    (with a row per group of ``groups``: see summary_table)."""
    choices = pd.DataFrame([r for model, _, ev in runs for r in choice_rows(model, ev)],
                           columns=["model", "objective", "chosen", "best", "exact", "regret", "within_5pct",
                                    "within_noise", "near_ties", "best_among_near_ties", "separated",
                                    "exact_per_round", "rounds_agree"])
    models = pd.DataFrame([model_row(model, setting, ev) for model, setting, ev in runs])
    configs = pd.DataFrame([r for model, _, ev in runs for r in configuration_rows(model, ev)])
    return {"choices": choices, "models": models, "configurations": configs,
            "summary": summary_table(choices, models, reference, groups)}


def plot_accuracy(summary: pd.DataFrame, reference: float, path: Path) -> Path:
    """Bars of exact and within-5% accuracy per objective and overall (with a repeated truth also
    within-noise and exact where the truth separates its best), the reference as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    part = summary[summary["scope"] != REFERENCE_SCOPE]
    xs = range(len(part))
    bars = [("exact", "exact best"), ("within_5pct", "within 5% regret")]
    if "within_noise" in part and part["within_noise"].notna().any():   # a repeated ground truth
        bars.append(("within_noise", "within the truth's noise"))
    if "exact_when_separated" in part and part["exact_when_separated"].notna().any():
        bars.append(("exact_when_separated", "exact where the truth separates its best"))
    width = 0.8 / len(bars)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for i, (column, label) in enumerate(bars):
        # a rate over no case (no separated case of an objective) draws no bar rather than 0 %
        heights = part[column].astype(float) if column == "exact_when_separated" else part[column].fillna(0)
        ax.bar([x - 0.4 + width * (i + 0.5) for x in xs], heights * 100, width=width, label=label)
    ax.axhline(reference * 100, color="k", linestyle="--", linewidth=1, label=f"{REFERENCE_SCOPE} {reference:.2%}")
    ax.set_xticks(list(xs), [f"{s}\n(n={int(c)})" for s, c in zip(part["scope"], part["cases"])])
    ax.set_ylabel("choices (%)")
    ax.set_ylim(0, 105)
    ax.set_title("Planner's choice against the measured best")
    # below the axes: inside, it hid the "all" bars
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8, frameon=False)
    return _save(fig, path)


def plot_errors(models: pd.DataFrame, path: Path) -> Path:
    """Per model: MAPE of time and energy (whole job and training phase) and the pre-training overhead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = [("mape_time", "MAPE time"), ("mape_energy", "MAPE energy"),
               ("mape_time_training", "MAPE time (training phase)"),
               ("mape_energy_training", "MAPE energy (training phase)"), ("pretrain_overhead", "pre-training overhead")]
    xs = list(range(len(models)))
    width = 0.8 / len(columns)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(models) + 2), 3.8))
    for i, (column, label) in enumerate(columns):
        ax.bar([x - 0.4 + width * (i + 0.5) for x in xs], models[column].astype(float).fillna(0) * 100,
               width=width, label=label)
    ax.set_xticks(xs, list(models["model"]))
    ax.set_ylabel("%")
    ax.set_title("Prediction errors and pre-training overhead per model")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_predicted_vs_measured(configs: pd.DataFrame, path: Path) -> Path:
    """Scatter of predicted against measured time and energy for every configuration, y = x dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    ok = configs.dropna(subset=["measured_time_s"]) if "measured_time_s" in configs else configs.iloc[:0]
    for ax, key, unit in ((axes[0], "time_s", "s"), (axes[1], "energy_j", "J")):
        for model, part in ok.groupby("model"):
            ax.scatter(part[f"measured_{key}"], part[f"predicted_{key}"], label=model, s=18)
        if len(ok):
            lo = min(ok[f"measured_{key}"].min(), ok[f"predicted_{key}"].min())
            hi = max(ok[f"measured_{key}"].max(), ok[f"predicted_{key}"].max())
            ax.plot([lo, hi], [lo, hi], "k--", linewidth=1)
            if hi / max(lo, 1e-12) > 20:
                ax.set_xscale("log")
                ax.set_yscale("log")
        ax.set_xlabel(f"measured {key.split('_')[0]} ({unit})")
        ax.set_ylabel(f"predicted {key.split('_')[0]} ({unit})")
    axes[0].legend(fontsize=7)
    fig.suptitle("Every configuration: predicted against measured")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    """Atomic write (temp file + os.replace), in the format of the path's suffix."""
    import matplotlib.pyplot as plt

    from hetcluster.fileio import write_figure_atomic

    fig.tight_layout()
    write_figure_atomic(path, fig, dpi=110)
    plt.close(fig)
    return Path(path)
