"""Summarize several fidelity runs (bench/fidelity/run.py outputs) as one Markdown table, and
with ``--write-docs`` write docs/fidelity.json (the median over the runs as the headline
figures, every run's figures under ``runs``) and docs/img/fidelity.png (the first run's plot).

    .venv-vllm/bin/python bench/fidelity/summarize.py [--write-docs] OUT1/fidelity.json ...
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from talaria.sim.plots import plot_fidelity

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = (
    ("p50 SCT err", "p50_sct_rel_error"),
    ("p95 SCT err", "p95_sct_rel_error"),
    ("call latency abs. err, median", "call_latency_median_rel_error"),
    ("call latency err, signed median", "call_latency_median_signed_rel_error"),
    ("TTFT abs. err, median", "ttft_median_rel_error"),
    ("session SCT abs. err, median", "sct_median_rel_error"),
)
HEADLINE = (
    "p50_sct_rel_error",
    "p95_sct_rel_error",
    "call_latency_median_rel_error",
    "call_latency_p95_rel_error",
    "call_latency_median_signed_rel_error",
    "ttft_median_rel_error",
    "sct_median_rel_error",
)


def _label(run: dict[str, Any]) -> str:
    return f"{run['sessions']}×{run['calls'] // run['sessions']}, seed {run['seed']}"


def _cells(figures: dict[str, Any]) -> str:
    return " | ".join(
        f"{figures[key]:+.1%}" if "signed" in key else f"{figures[key]:.1%}" for _, key in COLUMNS
    )


REPEAT_KEYS = (
    ("call latency |err| median", "call_latency_median_rel_error"),
    ("TTFT |err| median", "ttft_median_rel_error"),
    ("p50 SCT err", "p50_sct_rel_error"),
    ("p95 SCT err", "p95_sct_rel_error"),
)


def repeats_table(docs: list[dict[str, Any]]) -> str:
    """Per run with repeats: the median over its live runs of each error, predicted by the
    other live runs (the floor) and by the simulator."""
    head = " | ".join(f"{c}: live runs / simulator" for c, _ in REPEAT_KEYS)
    lines = [f"| run | live runs | {head} |", "|" + "---|" * (2 + len(REPEAT_KEYS))]
    for doc in docs:
        rep = doc.get("repeats")
        if rep is None:
            continue
        cells = []
        for _, key in REPEAT_KEYS:
            floor = statistics.median(f[key] for f in rep["live_vs_live"])
            sim = statistics.median(f[key] for f in rep["predicted_vs_live"])
            cells.append(f"{floor:.1%} / {sim:.1%}")
        lines.append(f"| {_label(doc['run'])} | {rep['runs']} | {' | '.join(cells)} |")
    return "\n".join(lines)


def table(docs: list[dict[str, Any]]) -> str:
    lines = ["| run | " + " | ".join(c for c, _ in COLUMNS) + " |", "|" + "---|" * 7]
    for doc in docs:
        lines.append(f"| {_label(doc['run'])} | {_cells(doc['figures'])} |")
    median = {k: statistics.median(d["figures"][k] for d in docs) for _, k in COLUMNS}
    lines.append(f"| **median** | {_cells(median)} |")
    worst = {k: max((d["figures"][k] for d in docs), key=abs) for _, k in COLUMNS}
    lines.append(f"| worst run | {_cells(worst)} |")
    un = {k: statistics.median(d["uncalibrated_figures"][k] for d in docs) for _, k in COLUMNS}
    lines.append(f"| uncalibrated profile, median | {_cells(un)} |")
    return "\n".join(lines)


def _entry(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    entry = {
        "figures": doc["figures"],
        "uncalibrated_figures": doc["uncalibrated_figures"],
        "recorded_arrivals_figures": doc.get("recorded_arrivals_figures"),
        "run": {k: v for k, v in doc["run"].items() if k != "calibration"},
        "source": str(path),
    }
    if "repeats" in doc:
        entry["repeats"] = doc["repeats"]
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="fidelity.json files of runs")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--also", nargs="*", type=Path, default=[],
        help="Further runs (e.g. another size) listed under other_runs, not in the headline.",
    )  # fmt: skip
    args = parser.parse_args()
    docs = [json.loads(p.read_text()) for p in args.runs]
    others = [json.loads(p.read_text()) for p in args.also]
    print(table(docs))
    if any("repeats" in d for d in docs):
        print()
        print(repeats_table(docs))
    if others:
        print()
        print(table(others))
    if args.write_docs:
        write_docs(docs, args.runs, others, args.also)


def write_docs(
    docs: list[dict[str, Any]],
    paths: list[Path],
    others: list[dict[str, Any]] | None = None,
    other_paths: list[Path] | None = None,
) -> None:
    """docs/fidelity.json (headline: the median over ``docs``, with the worst run of each
    figure) and docs/img/fidelity.png (the first run's plot)."""
    summary: dict[str, Any] = {
        k: statistics.median(d["figures"][k] for d in docs) for k in HEADLINE
    }
    summary["worst"] = {k: max((d["figures"][k] for d in docs), key=abs) for k in HEADLINE}
    summary["statistic"] = f"median over {len(docs)} runs"
    summary["seeds"] = [d["run"]["seed"] for d in docs]
    summary["sessions"] = sum(d["figures"]["sessions"] for d in docs)
    summary["calls"] = sum(d["figures"]["calls"] for d in docs)
    summary["runs"] = [_entry(d, p) for d, p in zip(docs, paths, strict=True)]
    summary["other_runs"] = [
        _entry(d, p) for d, p in zip(others or [], other_paths or [], strict=True)
    ]
    (ROOT / "docs" / "fidelity.json").write_text(json.dumps(summary, indent=1) + "\n")
    first = docs[0]["run"]
    title = (
        f"live vLLM-CPU run vs replay ({_label(first)}): {first['calls']} calls, "
        f"policy {first['policy']}, quantum {first['quantum_s']:g} s"
    )
    plot_fidelity(docs[0], ROOT / "docs" / "img" / "fidelity.png", title)
    print("wrote docs/fidelity.json and docs/img/fidelity.png")


if __name__ == "__main__":
    main()
