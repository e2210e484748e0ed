"""The run report: ``report.md`` first, PNG plots of every metric, ``summary.json``.

`troupe report RUN_DIR` rebuilds all three from ``metrics.jsonl`` and the saved config.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from troupe.platform.checkpoint import atomic_write_json, atomic_write_text
from troupe.platform.metrics import read_metrics

RESUMES = "resumes.json"  # one entry per --resume of the run, kept in its directory

# Metrics drawn first and named in the summary table, when an algorithm logs them.
HEADLINE = ("reward/mean", "eval/accuracy", "eval/reward", "loss/policy", "kl/ref")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table's lines: the header, its rule, one line per row of cell strings."""
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(row) + " |" for row in rows])


def record_resume(run_dir: Path, from_step: int, checkpoint: str | None, removed: list[str]) -> None:
    """Add a ``--resume`` to the run directory's record: the step it went on from, the
    checkpoint it restored (None: there was none, so it started again from step 0) and the
    temporary checkpoint folders it removed."""
    entries = read_resumes(run_dir)
    entries.append({"from_step": from_step, "checkpoint": checkpoint, "removed_partials": list(removed)})
    atomic_write_json(Path(run_dir) / RESUMES, entries)


def read_resumes(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / RESUMES
    return json.loads(path.read_text()) if path.is_file() else []


def resume_counts(run_dir: Path) -> dict[str, int]:
    """``{"resumes": N, "restarts": M}`` (M of the N started again from step 0, with no
    checkpoint to restore); ``{}`` for a run never resumed."""
    entries = read_resumes(run_dir)
    if not entries:
        return {}
    return {"resumes": len(entries), "restarts": sum(e.get("checkpoint") is None for e in entries)}


def series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in history:
        v = row.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(row["step"])
            ys.append(float(v))
    return xs, ys


def plot_metrics(history: list[dict[str, Any]], plots_dir: Path, groups: dict[str, list[str]] | None = None) -> list[Path]:
    """One PNG per metric family (the part of the key before '/'); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for row in history for k, v in row.items() if k != "step" and isinstance(v, int | float)})
    if groups is None:
        groups = {}
        for k in keys:
            groups.setdefault(k.split("/")[0], []).append(k)
    plots_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for family, members in groups.items():
        fig, ax = plt.subplots(figsize=(6, 3.6))
        drawn = 0
        for k in members:
            xs, ys = series(history, k)
            if not xs:
                continue
            drawn += 1
            if len(xs) < 30:
                ax.plot(xs, ys, marker="o", ms=3, label=k)
                continue
            # Long noisy curves: the raw series faint, a moving average on top shows the trend.
            (line,) = ax.plot(xs, ys, alpha=0.25, lw=0.8)
            w = max(3, len(ys) // 20)
            smooth = [sum(ys[max(0, i - w + 1): i + 1]) / len(ys[max(0, i - w + 1): i + 1]) for i in range(len(ys))]
            ax.plot(xs, smooth, color=line.get_color(), lw=1.8, label=f"{k} (mean of {w})")
        if not drawn:
            plt.close(fig)
            continue
        ax.set_xlabel("step")
        ax.set_title(family)
        ax.grid(alpha=0.3)
        if 1 < drawn <= 12:
            ax.legend(fontsize=7)
        elif drawn > 12:  # a legend that large hides the plot; the algorithm's own plots split such families
            ax.set_title(f"{family} ({drawn} series)")
        fig.tight_layout()
        path = plots_dir / f"{family.replace(' ', '_')}.png"
        tmp = path.with_suffix(".tmp.png")
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        tmp.replace(path)
        written.append(path)
    return written


def save_figure(fig: Any, path: Path, dpi: int = 110) -> str:
    """Write a matplotlib figure as a PNG atomically (a reader never sees half a plot), close
    it, and return the file's name."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path.name


def last_values(history: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for row in history:
        for k, v in row.items():
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
                out[k] = v
    return out


def first_values(history: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for row in history:
        for k, v in row.items():
            if k != "step" and k not in out and isinstance(v, int | float) and not isinstance(v, bool):
                out[k] = v
    return out


def write_report(
    run_dir: Path,
    algorithm: str,
    config: dict[str, Any],
    summary: dict[str, Any],
    sections: list[str] | None = None,
) -> Path:
    """Write ``summary.json``, the plots and ``report.md`` for ``run_dir``."""
    run_dir = Path(run_dir)
    history = read_metrics(run_dir / "metrics.jsonl")
    plot_metrics(history, run_dir / "plots")
    first, last = first_values(history), last_values(history)
    trained = [r["step"] for r in history if any(k != "step" and not k.startswith("eval/") for k in r)]
    summary = {"algorithm": algorithm, "steps": max(trained, default=-1) + 1,
               "first": first, "final": last, **summary, **resume_counts(run_dir)}
    atomic_write_json(run_dir / "summary.json", summary)

    # Top-down as a person reads it: the algorithm's result and claims, the plots, then every metric.
    lines = [f"# {algorithm} run: `{run_dir.name}`", ""]
    lines += [f"Steps logged: {summary['steps']}. Faults: {summary.get('faults', 0)}." + _resumes_line(run_dir), ""]
    for section in sections or []:
        lines += [section.rstrip(), ""]
    # Every PNG in plots/ (the algorithm's own too) that a section has not already shown.
    shown = "\n".join(sections or [])
    plots = [p for p in (run_dir / "plots").glob("*.png") if f"plots/{p.name}" not in shown]
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{p.stem}](plots/{p.name})" for p in sorted(plots, key=lambda p: _plot_order(p.stem))]
        lines.append("")
    keys = [k for k in HEADLINE if k in last] + sorted(k for k in last if k not in HEADLINE)
    if keys:
        lines += ["## Metrics: first and last", "", "| metric | first | last |", "|---|---|---|"]
        lines += [f"| {k} | {_fmt(first.get(k))} | {_fmt(last[k])} |" for k in keys]
        lines.append("")
    lines += ["## Config", "", "```json", json.dumps(config, indent=2, sort_keys=True), "```", ""]
    lines += ["Files: `config.yaml` (resolved config), `metrics.jsonl`, `tensorboard/`, `checkpoints/`, "
              "`summary.json`, `plots/`.", ""]
    path = run_dir / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return path


def _resumes_line(run_dir: Path) -> str:
    entries = read_resumes(run_dir)
    if not entries:
        return ""
    steps = ", ".join(str(e["from_step"]) for e in entries)
    restarts = sum(e.get("checkpoint") is None for e in entries)
    text = f" Resumed {len(entries)} time{'s' if len(entries) > 1 else ''} (from step {steps})"
    if restarts:
        text += (f"; {restarts} of them started again from step 0 in the same directory, "
                 "with no complete checkpoint to restore")
    return text + "."


def _plot_order(stem: str) -> tuple[int, str]:
    order = ["reward", "eval", "loss", "kl"]
    return (order.index(stem) if stem in order else len(order), stem)


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
