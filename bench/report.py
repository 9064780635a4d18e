"""Human-readable output of the chat benchmarks: a summary table and a PNG of TTFT by turn.

    python -m bench plot A.json [B.json ...] --out ttft.png [--label NAME ...]

overlays the TTFT-by-turn curves of several `serve` or `multiturn` result files
(for example our server with the cache on, then off, then another server).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path


def progress_log(tag: str, *, clock: bool = True) -> Callable[[str], None]:
    """A benchmark's progress lines on stderr (stdout may carry its JSON), "[tag 12.3s] msg"
    with the seconds since this call where clock is set."""
    start = time.perf_counter()

    def log(msg: str) -> None:
        stamp = f" {time.perf_counter() - start:6.1f}s" if clock else ""
        print(f"[{tag}{stamp}] {msg}", file=sys.stderr, flush=True)

    return log

def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def summary_table(title: str, summary: dict, turns: list[dict] | None = None) -> str:
    """A fixed-width block in the spirit of vLLM's `bench serve` printout."""
    rows = [
        ("Successful requests", str(summary["completed"])),
        ("Failed requests", str(summary["failed"])),
        ("Duration (s)", _num(summary["duration_s"])),
        ("Request throughput (req/s)", _num(summary["request_throughput"], 3)),
        ("Output token throughput (tok/s)", _num(summary["output_throughput"])),
        ("Total token throughput (tok/s)", _num(summary["total_token_throughput"])),
        ("Prompt tokens", str(summary["prompt_tokens"])),
        ("Cached prompt tokens", str(summary["cached_tokens"])),
        ("Cached share", _pct(summary["cached_share"])),
        ("Theoretical max cached share", _pct(summary["max_cached_share"])),
        ("Cached share / theoretical max", _pct(summary["cached_share_of_max"])),
    ]
    for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        s = summary[key]
        rows += [
            (f"{stat.capitalize()} {name} (ms)", _ms(s[stat]))
            for stat in ("mean", "p50", "p90", "p99")
        ]
    width = 50
    lines = [f" {title} ".center(width, "=")]
    lines += [f"{name:<36}{value:>14}" for name, value in rows]
    if turns:
        lines.append(" TTFT by turn ".center(width, "-"))
        lines.append(f"{'turn':>4} {'reqs':>5} {'p50 ms':>10} {'p90 ms':>10} {'cached':>9}")
        for t in turns:
            lines.append(
                f"{t['turn']:>4} {t['requests']:>5} {_ms(t['ttft_s']['p50']):>10} "
                f"{_ms(t['ttft_s']['p90']):>10} {_pct(t['cached_share']):>9}"
            )
    lines.append("=" * width)
    return "\n".join(lines)


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


def main(argv: list[str] | None = None) -> Path | None:
    p = argparse.ArgumentParser(prog="python -m bench plot", description=__doc__)
    p.add_argument("results", nargs="+", type=Path, help="JSON files of serve or multiturn runs")
    p.add_argument("--out", type=Path, default=Path("bench-results/ttft-by-turn.png"))
    p.add_argument("--label", action="append", default=[], help="one per file, in order")
    p.add_argument("--title", default="Time to first token by turn")
    args = p.parse_args(argv)
    series: dict[str, list[dict]] = {}
    for i, path in enumerate(args.results):
        label = args.label[i] if i < len(args.label) else path.stem
        series.update(series_of(json.loads(path.read_text()), label))
    written = plot_ttft_by_turn(series, args.out, args.title)
    if written:
        print(f"wrote {written}", file=sys.stderr)
    return written
