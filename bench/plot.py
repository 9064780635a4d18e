"""Overlay the TTFT-by-turn curves of several `serve` or `multiturn` result files
(for example our server with the cache on, then off, then another server).

    python -m bench plot A.json [B.json ...] --out ttft.png [--label NAME ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench import cli
from bench.ttft_plot import plot_ttft_by_turn, series_of


def main(argv: list[str] | None = None) -> Path | None:
    p = cli.parser("plot", __doc__)
    p.add_argument("results", nargs="+", type=Path, help="JSON files of serve or multiturn runs")
    cli.add(p, "out_png", cli.RESULTS / "ttft-by-turn.png")
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
