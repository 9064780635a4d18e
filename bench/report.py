"""What a benchmark prints and writes: progress lines, the chat summary table, the JSON."""

from __future__ import annotations

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


def write_json(path: Path, result: dict, log: Callable[[str], None] | None = None) -> Path:
    """Write a command's result (its folder made), say so on stderr, return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    (log or (lambda msg: print(msg, file=sys.stderr, flush=True)))(f"wrote {path}")
    return path
