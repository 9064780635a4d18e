"""The PNG of time to first token by turn, one line per run or system."""

from __future__ import annotations

import sys
from pathlib import Path


def plot_ttft_by_turn(series: dict[str, list[dict]], path: str | Path, title: str) -> Path | None:
    """One line per series: TTFT p50 (solid) and p90 (dotted) against turn index.
    Returns the path written, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator, NullFormatter, ScalarFormatter
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    shown: list[float] = []
    for label, turns in series.items():
        xs = [t["turn"] for t in turns if t["ttft_s"]["p50"] is not None]
        p50 = [t["ttft_s"]["p50"] * 1000 for t in turns if t["ttft_s"]["p50"] is not None]
        p90 = [t["ttft_s"]["p90"] * 1000 for t in turns if t["ttft_s"]["p90"] is not None]
        shown += p50 + p90
        (line,) = ax.plot(xs, p50, marker="o", label=f"{label} p50")
        ax.plot(xs, p90, linestyle=":", color=line.get_color(), label=f"{label} p90")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("turn")
    ax.set_ylabel("time to first token (ms)")
    if shown and max(shown) > 10 * max(min(shown), 1e-6):  # log scale only for wide ranges
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def series_of(result: dict, label: str) -> dict[str, list[dict]]:
    """TTFT-by-turn series in a `serve` result (one) or a `multiturn` result (one per system)."""
    if "by_turn" in result:
        return {label: result["by_turn"]}
    return {
        f"{label} {name}" if label else name: sys_result["by_turn"]
        for name, sys_result in result.get("systems", {}).items()
    }
