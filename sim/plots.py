"""Figures for experiment documents (``talaria.sim.experiment``) and sensitivity sweeps.

Everything is drawn on a bare :class:`~matplotlib.figure.Figure` with the Agg canvas, so no
global pyplot state is touched and the module is safe in headless runs and tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from talaria.sim.metrics import percentile

DPI = 120
TIMELINE_POLICIES = ("round", "talaria")
BOLD_POLICIES = frozenset(TIMELINE_POLICIES)
PAPER_SPEEDUP = {"p50": 5.3, "p95": 2.6}
_REFERENCES = {"oracle": ("black", "--"), "dedicated": ("0.45", ":")}


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out, dpi=DPI, format="png")
    return out


def _p50(summary: dict[str, Any], values: Sequence[float]) -> float:
    p50 = summary.get("p50_sct_s")
    return float(p50) if p50 is not None else percentile(values, 50)


def _cdf_panel(ax: Axes, doc: dict[str, Any]) -> None:
    """Empirical SCT CDF per policy, with oracle and dedicated as dashed/dotted references."""
    curves: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for i, (name, summary) in enumerate(doc.get("policies", {}).items()):
        width = 2.6 if name in BOLD_POLICIES else 1.3
        curves.append((name, summary, {"color": f"C{i % 10}", "linewidth": width}))
    for name, (color, dash) in _REFERENCES.items():
        if name in doc:
            curves.append((name, doc[name], {"color": color, "linestyle": dash, "linewidth": 1.8}))
    seen: list[float] = []
    for name, summary, style in curves:
        xs = sorted(float(v) for v in summary.get("sct_s", {}).values())
        if not xs:
            continue
        seen.extend(xs)
        ys = [0.0, *((i + 1) / len(xs) for i in range(len(xs)))]
        label = f"{name} (p50 {_p50(summary, xs):.1f} s)"
        ax.step([xs[0], *xs], ys, where="post", label=label, **style)
    positive = [v for v in seen if v > 0]
    if positive and max(positive) / min(positive) > 20:
        ax.set_xscale("log")
    ax.set_xlabel("session completion time (s)")
    ax.set_ylabel("fraction of sessions")
    ax.set_ylim(0.0, 1.02)
    ax.set_title("Session completion time (CDF)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="policy")


def _models(doc: dict[str, Any], timelines: Sequence[Sequence[dict[str, Any]]]) -> list[str]:
    """The models in a stable order: the setup's, then any others in order of appearance."""
    models = [str(m) for m in doc.get("setup", {}).get("models", ())]
    for timeline in timelines:
        for slot in timeline:
            for model in (slot["model"], *slot.get("co_resident", ())):
                if model not in models:
                    models.append(str(model))
    return models


def _timeline_panel(
    ax: Axes, name: str, timeline: Sequence[dict[str, Any]], colors: dict[str, str]
) -> None:
    """One row per node, one bar per slot; the switch part of each slot is hatched and faded.
    Models co-resident with the slot's model (co-residency) are thin bars under it."""
    nodes: list[str] = []
    for slot in timeline:
        if slot["node"] not in nodes:
            nodes.append(str(slot["node"]))
    for slot in timeline:
        y = nodes.index(str(slot["node"]))
        start, switch = float(slot["start_s"]), float(slot["switch_s"])
        end = float(slot["end_s"])
        color = colors[str(slot["model"])]
        if switch > 0:
            ax.barh(y, switch, left=start, height=0.6, color=color, alpha=0.45, hatch="////")
            ax.barh(y, switch, left=start, height=0.6, fill=False, edgecolor="0.2", lw=0.5)
        if end > start + switch:
            ax.barh(y, end - start - switch, left=start + switch, height=0.6, color=color)
        for k, other in enumerate(slot.get("co_resident", ())):
            ax.barh(
                y + 0.2 + 0.12 * k,
                end - start,
                left=start,
                height=0.12,
                color=colors.get(str(other), "0.5"),
            )
    total = sum(float(s["switch_s"]) for s in timeline)
    ax.set_title(f"{name}: {len(timeline)} model slots, {total:.0f} s switching", fontsize=10)
    ax.set_yticks(range(len(nodes)), nodes, fontsize=8)
    ax.set_ylim(-0.6, len(nodes) - 0.4)
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)


def plot_experiment(doc: dict[str, Any], path: str | Path, title: str | None = None) -> Path:
    """Write the SCT CDF and the round/talaria slot timelines of ``doc`` as one PNG."""
    policies: dict[str, Any] = doc.get("policies", {})
    shown = [p for p in TIMELINE_POLICIES if policies.get(p, {}).get("timeline")]
    timelines = [policies[p]["timeline"] for p in shown]
    colors = {m: f"C{i % 10}" for i, m in enumerate(_models(doc, timelines))}
    fig = Figure(figsize=(12, 9), dpi=DPI)
    grid = fig.add_gridspec(1 + len(shown), 1, height_ratios=[2.2] + [1.0] * len(shown))
    _cdf_panel(fig.add_subplot(grid[0]), doc)
    first: Axes | None = None
    for i, (name, timeline) in enumerate(zip(shown, timelines, strict=True)):
        ax = fig.add_subplot(grid[i + 1], sharex=first)
        first = first or ax
        _timeline_panel(ax, name, timeline, colors)
        if i == 0:
            used = {str(s["model"]) for t in timelines for s in t}
            handles = [Patch(color=c, label=m) for m, c in colors.items() if m in used]
            handles.append(Patch(facecolor="0.7", hatch="////", edgecolor="0.2", label="switch"))
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        if i < len(shown) - 1:
            ax.tick_params(labelbottom=False)
        else:
            ax.set_xlabel("time (s)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def _number(value: Any) -> float:
    return float(value) if value is not None else math.nan


def plot_sweep(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """One panel per swept parameter: talaria's p50/p95 speedup over round against its value."""
    params: list[str] = []
    for row in rows:
        if row["param"] not in params:
            params.append(str(row["param"]))
    ncols = max(1, min(len(params), 3))
    nrows = max(1, math.ceil(len(params) / ncols))
    fig = Figure(figsize=(4.5 * ncols, 3.6 * nrows), dpi=DPI)
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(nrows * ncols)]
    for ax, param in zip(axes, params, strict=False):
        points = sorted((r for r in rows if r["param"] == param), key=lambda r: float(r["value"]))
        xs = [float(r["value"]) for r in points]
        for color, (q, marker) in enumerate((("p50", "o"), ("p95", "s"))):
            ys = [_number(r.get(f"speedup_{q}")) for r in points]
            ax.plot(xs, ys, marker=marker, color=f"C{color}", label=f"speedup {q}")
            paper = PAPER_SPEEDUP[q]
            ax.axhline(paper, color=f"C{color}", ls="--", lw=1, alpha=0.7, label=f"paper {q}")
            ax.annotate(
                f"paper {paper}×",
                (0.01, paper),
                xycoords=("axes fraction", "data"),
                fontsize=7,
                color=f"C{color}",
                va="bottom",
            )
        positive = [x for x in xs if x > 0]
        if len(positive) == len(xs) and positive and max(positive) / min(positive) > 20:
            ax.set_xscale("log")
        ax.set_title(param, fontsize=10)
        ax.set_xlabel("value")
        ax.set_ylabel("speedup vs round (×)")
        ax.grid(True, alpha=0.3)
    for ax in axes[len(params) :]:
        ax.set_axis_off()
    if params:
        axes[0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    return _save(fig, path)


def plot_fidelity(doc: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """Predicted vs measured: call latency, TTFT (log–log, per call) and SCT (per session), with
    the y = x line and a ±10% band. ``doc`` is ``talaria.sim.fidelity.compare``'s result."""
    fig = Figure(figsize=(13, 4.4))
    panels = (
        ("call latency", doc["calls"], "latency_s"),
        ("time to first token", doc["calls"], "ttft_s"),
        ("session completion time", doc["sessions"], "sct_s"),
    )
    figures = doc["figures"]
    notes = {
        "latency_s": f"|err| median {figures['call_latency_median_rel_error']:.1%}, "
        f"p95 {figures['call_latency_p95_rel_error']:.1%}",
        "ttft_s": f"|err| median {figures['ttft_median_rel_error']:.1%}, "
        f"p95 {figures['ttft_p95_rel_error']:.1%}",
        "sct_s": f"p50 SCT err {figures['p50_sct_rel_error']:.1%}, "
        f"p95 SCT err {figures['p95_sct_rel_error']:.1%}",
    }
    for i, (label, rows, key) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        measured = [r[f"measured_{key}"] for r in rows]
        predicted = [r[f"predicted_{key}"] for r in rows]
        positive = [v for v in measured + predicted if v > 0]
        lo, hi = min(positive) * 0.8, max(positive) * 1.25
        for k, model in enumerate(sorted({r["model"] for r in rows})):
            mine = [r for r in rows if r["model"] == model]
            ax.scatter([r[f"measured_{key}"] for r in mine], [r[f"predicted_{key}"] for r in mine],
                       s=14, alpha=0.75, color=f"C{k}", label=model, zorder=3)  # fmt: skip
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, zorder=2)
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.88",
                        label="±10%", zorder=1)  # fmt: skip
        if key != "sct_s":
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {label} (s)")
        ax.set_ylabel(f"predicted {label} (s)")
        ax.set_title(notes[key], fontsize=9)
        ax.legend(fontsize=8, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def plot_plan(doc: dict[str, Any], path: str | Path) -> Path:
    """GPUs needed against the SLO (each model's p95 SCT ÷ its p95 on a whole node of its
    own), per layout family: for each SLO the fewest GPUs evaluated that meet it (``talaria
    plan``'s replays, read off again for every SLO); the plan's own SLO dashed."""
    reference = doc["reference"]["p95_by_model"]
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    xs = [1.0 + 0.05 * i for i in range(61)]  # 1× to 4×
    for family in ("talaria", "static", "dedicated", "dedicated_node"):
        points = [p for p in doc["points"] if p["family"] == family]
        if not points:
            continue
        ys = []
        for x in xs:
            meeting = [
                p["gpus"]
                for p in points
                if all(p["p95_by_model"][m] <= x * reach for m, reach in reference.items())
            ]
            ys.append(min(meeting) if meeting else math.nan)
        ax.step(xs, ys, where="post", label=family, linewidth=2 if family == "talaria" else 1.2)
    if doc["slo"]["x"] is not None:
        ax.axvline(doc["slo"]["x"], color="0.4", linestyle="--", label="plan's SLO")
    ax.set_xlabel("SLO: each model's p95 SCT ÷ its p95 on a whole node of its own")
    ax.set_ylabel("GPUs needed")
    ax.set_title(f"preset {doc['preset']}, seed {doc['seed']}: GPUs needed against the SLO")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return _save(fig, path)
