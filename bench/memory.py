"""Resident memory of our server (daphne, as `make run` serves) after a multi-turn
replay, for each weight dtype, on this process's kernel path.

    python -m bench memory [--weight-dtypes fp32,bf16,int8,int4,auto] [--num-conversations 16]
        [--turns 6] [--out bench-results/memory.json]

Each server starts alone on a fresh database, replays bench/serve.py's multi-turn
workload (all conversations at once), and its VmRSS (resident now) and VmHWM (its
peak) are read from /proc; after the replay, its resident memory by kind too (libraries,
mapped files such as quantized weights, anonymous memory and its largest mapping, the
KV pool) from /proc/<pid>/smaps. The KV pool has the same size in bytes for every dtype
(kv_cache_memory_bytes), and on a CPU becomes resident as its blocks are written: what
differs is the weights, and the bytes of the tokens the replay left cached. Set
PREFIXCHAT_CPU_PATH (with kernels.cpu_features.LIBRARY_ENV's variables) to measure a
lesser path.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import cli
from bench.report import progress_log
from bench.servers import ServerSettings, readyz_field, start_ours
from bench.sizes import CHAT
from kernels.cpu_features import cpu_path

log = progress_log("bench memory")


def resident_by_kind(smaps: str) -> dict[str, float]:
    """A process's resident MiB by what its mappings hold, from /proc/<pid>/smaps text:
    shared libraries, other mapped files (a quantized model's weights), and anonymous
    memory (the heap, torch's tensors, the KV pool). The largest anonymous mapping is
    given apart: in our server, the KV pool's (a mapping of its own, resident as
    written)."""
    kinds = {"libraries": 0, "files": 0, "anonymous": 0}
    largest = 0
    kind = "anonymous"
    for line in smaps.splitlines():
        head, _, rest = line.partition(" ")
        if "-" in head and ":" not in head:  # a mapping's first line: perms, offset, ...
            fields = rest.split(maxsplit=4)
            name = fields[4].strip() if len(fields) > 4 else ""
            kind = ("libraries" if ".so" in name.rsplit("/", 1)[-1]
                    else "files" if name.startswith("/") else "anonymous")
        elif head == "Rss:":
            size = int(rest.split()[0])  # kB
            kinds[kind] += size
            if kind == "anonymous":
                largest = max(largest, size)
    out = {k: v / 1024 for k, v in kinds.items()}
    out["largest_anonymous"] = largest / 1024
    return out


def rss_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def measure(dtype: str, args: argparse.Namespace, logs: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        server = start_ours(dtype, f"memory-{dtype}", ServerSettings(), logs,
                            Path(tmp) / "db.sqlite3")
        try:
            started = rss_mib(server.proc.pid)
            kv_dtype = readyz_field(server.url, "kv_dtype")
            replay = subprocess.run(
                [sys.executable, "-m", "bench", "serve", "--url", server.url, "--api-key",
                 server.api_key, "--workload", "multiturn", "--num-conversations",
                 str(args.conversations), "--turns", str(args.turns), "--out",
                 str(Path(tmp) / "serve.json")],
                capture_output=True, text=True, timeout=3600,
            )
            if replay.returncode:
                raise SystemExit(f"the replay failed:\n{replay.stderr[-3000:]}")
            after = rss_mib(server.proc.pid)
            kinds = resident_by_kind(Path(f"/proc/{server.proc.pid}/smaps").read_text())
        finally:
            server.stop()
    return {"weight_dtype": dtype, "cpu_path": server.cpu_path, "kv_dtype": kv_dtype,
            "rss_after_start_mib": started["VmRSS"], "rss_after_replay_mib": after["VmRSS"],
            "peak_mib": after["VmHWM"], "after_replay_by_kind_mib": kinds}


def main(argv: list[str] | None = None) -> dict:
    p = cli.parser("memory", __doc__)
    cli.add(p, "weight_dtypes", "fp32,bf16,int8,int4")
    cli.add_chat_shape(p, CHAT, ("num_conversations", "turns"))
    cli.add(p, "logs", cli.RESULTS / "memory-logs")
    cli.add(p, "out", cli.RESULTS / "memory.json")
    args = p.parse_args(argv)
    args.conversations = args.num_conversations  # as measure() and the JSON read it
    args.logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for dtype in args.weight_dtypes.split(","):
        log(f"{dtype}: start, replay {args.conversations} x {args.turns}")
        runs.append(measure(dtype, args, args.logs))
    base = next((r for r in runs if r["weight_dtype"] == "fp32"), None)
    print(f"kernel path: {cpu_path()}")
    print(f"{'weights':8s} {'path':12s} {'KV':>9s} {'start MiB':>10s} {'after MiB':>10s} "
          f"{'peak MiB':>9s} {'/ fp32':>7s}")
    for r in runs:
        ratio = r["rss_after_replay_mib"] / base["rss_after_replay_mib"] if base else float("nan")
        print(f"{r['weight_dtype']:8s} {r['cpu_path']:12s} {r['kv_dtype'] or '?':>9s} "
              f"{r['rss_after_start_mib']:10.0f} "
              f"{r['rss_after_replay_mib']:10.0f} {r['peak_mib']:9.0f} {ratio:7.2f}")
    print("after the replay, by kind (MiB): libraries, mapped files, anonymous (its largest "
          "mapping: the KV pool)")
    for r in runs:
        k = r["after_replay_by_kind_mib"]
        print(f"{r['weight_dtype']:8s} {k['libraries']:10.0f} {k['files']:10.0f} "
              f"{k['anonymous']:10.0f} ({k['largest_anonymous']:.0f})")
    data = {"kind": "memory", "cpu_path": cpu_path(), "conversations": args.conversations,
            "turns": args.turns, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2))
    log(f"wrote {args.out}")
    return data


if __name__ == "__main__":
    main()
