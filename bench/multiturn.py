"""The multi-turn chat workload in-process: our engine with prefix caching, without it,
and transformers' `generate`, on the same prompt token ids, in one run.

    python -m bench multiturn [--quick] [--dtype bfloat16|float32] [--threads N]
        [--model PATH] [--out bench-results/multiturn.json] [--plot bench-results/multiturn.png]
        [--num-conversations N] [--turns T] [--system-tokens S] [--user-tokens U]
        [--reply-tokens R] [--conversations FILE.jsonl] [--concurrency C]

Sizes: 16 conversations x 6 turns, S=512, U=60, R=64 (--quick: 4 x 3, S=128, U=24, R=8).

1. Cache on: N conversations (at most --concurrency at once) of T turns on a shared
   system prompt; each turn's prompt is the previous prompt, the reply's own token
   ids and the new user turn rendered by the tokenizer's chat template (token-level
   history, as the chat app keeps it). Replies are greedy and exactly R tokens
   (ignore_eos). One warm-up request with the system prompt precedes the run.
2. Cache off: the same prompts (recorded in 1), same concurrency, on an engine
   with enable_prefix_caching=False.
3. transformers: `generate` on the same prompts, one request at a time (it has no
   scheduler), for the first --hf-conversations conversations only: it is slow.
4. One request alone (each conversation gets one more turn): its TTFT with the cache
   hit, the TTFT of a fresh request holding only its uncached suffix, and the TTFT of
   the whole prompt on the cache-off engine.
5. The 0 %-hit cost: the random workload (nothing shared) served by the cache-on
   and cache-off engines at once, taking steps in turn, each timed inside its own
   calls; the median of the repeats' throughput ratios.

The theoretical maximum cached share is exact here: per request, the longest prefix
it shares with the tokens computed before it (the warm-up, the conversation's
previous prompt and reply less the reply's last token), in whole blocks, never the
prompt's last token.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from bench import cli
from bench import conversations as wl
from bench.chat_runs import ChatPrompts, note_output, system_result
from bench.engine_runs import engine_config, greedy, time_to_first_token, warm_up
from bench.hf_runs import hf_generate, load_hf_model, pad_token_id
from bench.metrics import RequestRecord, percentile, stats
from bench.report import progress_log, summary_table, write_json
from bench.sizes import CHAT, QUICK_CHAT
from bench.ttft_plot import plot_ttft_by_turn
from bench.workloads import chat_prompt_ids, next_turn_ids
from inference.config import DEFAULT_MODEL, EngineConfig
from inference.llm_engine import LLMEngine
from inference.sampling_params import InvalidRequestError

DEFAULT_OUT = cli.RESULTS / "multiturn.json"
DEFAULT_PLOT = cli.RESULTS / "multiturn.png"
_ids = itertools.count()


log = progress_log("multiturn")


@dataclass(frozen=True)
class ChatSizes:
    conversations: int
    turns: int
    system_tokens: int
    user_tokens: int
    reply_tokens: int
    hf_conversations: int  # transformers runs this many conversations
    random_requests: int  # the 0 %-hit workload: requests of system_tokens + user_tokens
    overhead_repeats: int
    hit_samples: int  # cache hit vs fresh suffix: this many pairs


FULL = ChatSizes(
    **asdict(CHAT),
    hf_conversations=4,
    random_requests=16,
    overhead_repeats=5,
    hit_samples=16,
)
QUICK = ChatSizes(
    **asdict(QUICK_CHAT),
    hf_conversations=2,
    random_requests=8,
    overhead_repeats=1,
    hit_samples=4,
)


# --- our engine ------------------------------------------------------------------
PromptFor = Callable[[int, int, "tuple[list[int], list[int]] | None"], list[int]]


def run_chats(
    engine: LLMEngine,
    conversations: int,
    turns: list[int],
    prompt_for: PromptFor,
    reply_tokens: int,
    concurrency: int,
    replies: dict | None = None,
) -> tuple[list[RequestRecord], float]:
    """Drive the engine like a serving front end: a conversation's next turn is added
    as soon as its previous reply finishes; returns (records, wall seconds). Reply ids
    go into `replies` by (conversation, turn) when given."""
    todo = deque(range(conversations))
    active: dict[str, tuple[RequestRecord, list[int]]] = {}
    records: list[RequestRecord] = []
    params = greedy(reply_tokens)
    total = sum(turns[:conversations])

    def start(conv: int, turn: int, prev) -> None:
        prompt = prompt_for(conv, turn, prev)
        rid = f"chat-{next(_ids)}"
        rec = RequestRecord(
            conversation=conv, turn=turn, start=time.perf_counter(), prompt_tokens=len(prompt)
        )
        try:
            engine.add_request(rid, prompt, params)
        except InvalidRequestError as exc:  # e.g. longer than the context: counted, skipped
            rec.error = str(exc)
            records.append(rec)
            if todo:
                start(todo.popleft(), 1, None)
            return
        active[rid] = (rec, prompt)

    began = time.perf_counter()
    while todo and len(active) < concurrency:
        start(todo.popleft(), 1, None)
    while active:
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            rec, prompt = active[out.request_id]
            if not note_output(rec, out, now):
                continue
            del active[out.request_id]
            records.append(rec)
            if total >= 20 and len(records) % (total // 5) == 0:
                log(f"  {len(records)}/{total} requests")
            if replies is not None:
                replies[(rec.conversation, rec.turn)] = out.token_ids
            if rec.ok and rec.turn < turns[rec.conversation]:
                start(rec.conversation, rec.turn + 1, (prompt, out.token_ids))
            elif todo:
                start(todo.popleft(), 1, None)
    return records, time.perf_counter() - began


# --- transformers --------------------------------------------------------------
def run_transformers(
    model,
    prompts: ChatPrompts,
    conversations: int,
    turns: list[int],
    reply_tokens: int,
    pad_id: int,
) -> tuple[list[RequestRecord], float]:

    records: list[RequestRecord] = []
    began = time.perf_counter()
    for conv in range(conversations):
        for turn in range(1, turns[conv] + 1):
            prompt = prompts.recorded.get((conv, turn))
            if prompt is None:  # the live run stopped this conversation early
                break
            rec = RequestRecord(
                conversation=conv, turn=turn, start=time.perf_counter(), prompt_tokens=len(prompt)
            )
            clock, out = hf_generate(model, [prompt], reply_tokens, pad_id)
            rec.end = time.perf_counter()
            rec.chunk_times = clock.times[1:]
            rec.first_token = rec.chunk_times[0]
            rec.completion_tokens = out.shape[1]
            records.append(rec)
    return records, time.perf_counter() - began


# --- the pieces ----------------------------------------------------------------
def chat_engine_config(
    workload: wl.Workload,
    sizes: ChatSizes,
    dtype: str,
    model: str,
    caching: bool,
    concurrency: int,
) -> EngineConfig:
    """A pool that holds every conversation's whole history at once (plus the random
    workload), so nothing is evicted or preempted: the run measures the cache, not
    the pool's size."""
    chats = 0
    for c in workload.conversations:
        tokens = c.system_tokens + sum(t.user_tokens + workload.reply_tokens + 32 for t in c.turns)
        chats += tokens // 16 + len(c.turns) + 4
    randoms = sizes.random_requests * (
        (sizes.system_tokens + sizes.user_tokens + sizes.reply_tokens) // 16 + 4
    )
    return engine_config(
        model,
        dtype,
        num_blocks=max(chats, randoms) + 128,
        max_num_seqs=max(concurrency, sizes.random_requests),
        enable_prefix_caching=caching,
    )


def hit_versus_fresh(
    engine: LLMEngine,
    off: LLMEngine,
    prompts: ChatPrompts,
    workload: wl.Workload,
    sizes: ChatSizes,
    seed: int,
) -> dict:
    """Per conversation, one more turn: a cache hit on its whole history, then a fresh
    request made of only that turn's uncached tokens, then the whole prompt on the
    cache-off engine; each alone (no batching, no queue), so these are pure latencies."""
    count = wl.token_counter(prompts.tok)
    hits, fresh, full, pairs = [], [], [], []
    for conv in range(min(sizes.hit_samples, len(workload.conversations))):
        last = len(workload.conversations[conv].turns)
        prompt_last = prompts.recorded[(conv, last)]
        reply = prompts.replies[(conv, last)]
        user, _ = wl.make_text(wl.seeded_rng(seed, "extra", conv), sizes.user_tokens, count)
        messages = prompts.messages(conv, last)
        ids = next_turn_ids(prompts.tok, messages, prompt_last, reply, user)
        t_hit, cached = time_to_first_token(engine, ids)
        suffix = ids[cached:]
        t_fresh, cached_fresh = time_to_first_token(engine, suffix)
        t_full, _ = time_to_first_token(off, ids)
        hits.append(t_hit)
        fresh.append(t_fresh)
        full.append(t_full)
        pairs.append(
            {
                "prompt_tokens": len(ids),
                "cached_tokens": cached,
                "suffix_tokens": len(suffix),
                "suffix_cached_tokens": cached_fresh,
                "hit_ttft_s": t_hit,
                "fresh_ttft_s": t_fresh,
                "uncached_ttft_s": t_full,
            }
        )
    h, f, u = stats(hits), stats(fresh), stats(full)
    return {
        "hit_ttft_s": h,
        "fresh_suffix_ttft_s": f,
        "uncached_ttft_s": u,
        "hit_over_fresh_p50": h["p50"] / f["p50"] if f["p50"] else None,
        "hit_over_uncached_p50": h["p50"] / u["p50"] if u["p50"] else None,
        "pairs": pairs,
    }


def interleaved_runs(
    engines: dict[str, LLMEngine], prompts: list[list[int]], reply_tokens: int
) -> dict[str, dict]:
    """Every engine serves the same prompts, all added at once, the engines taking
    steps in turn (A B, B A, A B, ...). Each one's throughput is its tokens over the
    seconds spent in its own add_request and step calls: a slow spell of the machine,
    which on a shared 2-core host lasts seconds, lands on both sides alike."""
    params = greedy(reply_tokens)
    busy = dict.fromkeys(engines, 0.0)
    counts = {
        name: dict.fromkeys(("prompt", "completion", "cached", "ok", "failed"), 0)
        for name in engines
    }
    for name, engine in engines.items():
        began = time.perf_counter()
        for prompt in prompts:
            engine.add_request(f"zero-hit-{next(_ids)}", prompt, params)
        busy[name] += time.perf_counter() - began
        counts[name]["prompt"] = sum(map(len, prompts))
    names = list(engines)
    for turn in itertools.count():
        live = [n for n in names if engines[n].has_unfinished_requests()]
        if not live:
            break
        for name in live if turn % 2 == 0 else live[::-1]:
            began = time.perf_counter()
            outs = engines[name].step()
            busy[name] += time.perf_counter() - began
            for out in outs:
                if out.finished:
                    c = counts[name]
                    c["completion"] += len(out.token_ids)
                    c["cached"] += out.cached_tokens
                    c["ok" if out.finish_reason in ("stop", "length") else "failed"] += 1
    return {
        name: {
            "busy_s": busy[name],
            "total_token_throughput": (c["prompt"] + c["completion"]) / busy[name],
            "output_throughput": c["completion"] / busy[name],
            "cached_tokens": c["cached"],
            "completed": c["ok"],
            "failed": c["failed"],
        }
        for name, c in counts.items()
    }


def zero_hit_overhead(on: LLMEngine, off: LLMEngine, sizes: ChatSizes, seed: int) -> dict:
    """Throughput on the random workload (nothing shared), cache on vs off: the same
    prompts, all at once, both engines stepping in turn (interleaved_runs), repeated;
    the figure is the median of the repeats' ratios (the best run of each side is
    reported too)."""
    tok = on.tokenizer
    workload = wl.random_requests(
        sizes.random_requests, sizes.system_tokens, sizes.user_tokens, sizes.reply_tokens, seed, tok
    )
    prompts = [chat_prompt_ids(tok, c.messages([])) for c in workload.conversations]
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for _ in range(sizes.overhead_repeats):
        on.reset_prefix_cache()  # the same prompts again must not hit
        off.reset_prefix_cache()
        for name, run in interleaved_runs(
            {"on": on, "off": off}, prompts, sizes.reply_tokens
        ).items():
            runs[name].append(run)
    best = {k: max(r["total_token_throughput"] for r in v) for k, v in runs.items()}
    paired = [
        a["total_token_throughput"] / b["total_token_throughput"]
        for a, b in zip(runs["on"], runs["off"], strict=True)
    ]
    ratio = percentile(paired, 50)
    return {
        "workload": workload.describe(),
        "method": "both engines in one loop, taking steps in turn; time inside each one's calls",
        "runs": runs,
        "paired_on_over_off": paired,
        "on_over_off": ratio,
        "best_on_over_best_off": best["on"] / best["off"],
        "best_total_tokens_per_s": best,
        "cost_percent": (1 - ratio) * 100,
    }


def ratios(systems: dict, hit: dict, overhead: dict) -> dict:
    def p50(name: str) -> float | None:
        return systems[name]["turns_2_plus"]["ttft_s"]["p50"] if name in systems else None

    on, off, hf = p50("cache_on"), p50("cache_off"), p50("transformers")
    share = systems["cache_on"]["summary"]["cached_share_of_max"]
    out = {
        "ttft_p50_turns_2_plus_s": {"cache_on": on, "cache_off": off, "transformers": hf},
        "ttft_turns_2_plus_cache_on_over_off": on / off if on and off else None,
        "ttft_turns_2_plus_cache_on_over_transformers": on / hf if on and hf else None,
        "cached_share_of_theoretical_max": share,
        "hit_over_fresh_suffix_ttft_p50": hit["hit_over_fresh_p50"],
        # One request alone, no queue: the prefill latency the cache saves.
        "ttft_alone_cache_hit_over_uncached_p50": hit["hit_over_uncached_p50"],
        "zero_hit_cache_on_over_off_throughput": overhead["on_over_off"],
        "output_throughput_tok_s": {
            k: v["summary"]["output_throughput"] for k, v in systems.items()
        },
    }
    checks = [
        ("cached share >= 95 % of the theoretical max", share, lambda x: x >= 0.95),
        (
            "TTFT p50 turns >= 2: cache on <= 0.2 x off",
            out["ttft_turns_2_plus_cache_on_over_off"],
            lambda x: x <= 0.2,
        ),
        (
            "TTFT of a cache hit <= 1.5 x fresh uncached suffix",
            out["hit_over_fresh_suffix_ttft_p50"],
            lambda x: x <= 1.5,
        ),
        (
            "cache on at 0 % hits costs <= 3 % throughput",
            out["zero_hit_cache_on_over_off_throughput"],
            lambda x: x >= 0.97,
        ),
    ]
    out["targets"] = {
        name: {"value": v, "met": None if v is None else bool(ok(v))} for name, v, ok in checks
    }
    return out


def chat_workload(
    sizes: ChatSizes, seed: int, tokenizer, conversations: Path | None = None
) -> wl.Workload:
    """The generated multi-turn workload, or the first sizes.conversations of a JSONL file."""
    return wl.build(
        "multiturn",
        conversations=sizes.conversations,
        turns=sizes.turns,
        system_tokens=sizes.system_tokens,
        user_tokens=sizes.user_tokens,
        reply_tokens=sizes.reply_tokens,
        seed=seed,
        tokenizer=tokenizer,
        jsonl=conversations,
    )


def run(
    sizes: ChatSizes,
    dtype: str,
    model: str = DEFAULT_MODEL,
    concurrency: int | None = None,
    seed: int = 0,
    quick: bool = False,
    conversations: Path | None = None,
) -> dict:
    from inference.loader import load_tokenizer

    started = time.perf_counter()
    tok = load_tokenizer(model)
    workload = chat_workload(sizes, seed, tok, conversations)
    n_conv = len(workload.conversations)
    concurrency = concurrency or n_conv
    log(f"loading two engines ({dtype})")
    on = LLMEngine(chat_engine_config(workload, sizes, dtype, model, True, concurrency), tok)
    off = LLMEngine(chat_engine_config(workload, sizes, dtype, model, False, concurrency), tok)
    bs = on.config.block_size
    prompts = ChatPrompts(tok, workload)
    warm = chat_prompt_ids(tok, workload.warmup_messages())
    turns = [len(c.turns) for c in workload.conversations]
    systems: dict[str, dict] = {}

    log(f"cache on: {n_conv} conversations, {sum(turns)} requests")
    warm_up(on, warm)
    records, seconds = run_chats(
        on,
        n_conv,
        turns,
        prompts.build,
        sizes.reply_tokens,
        concurrency,
        prompts.replies,
    )
    systems["cache_on"] = system_result(
        records, seconds, prompts, warm, bs, "our engine, prefix caching on"
    )
    log("one request alone: cache hit, its uncached suffix, the whole prompt uncached")
    warm_up(off, warm)
    hit = hit_versus_fresh(on, off, prompts, workload, sizes, seed)

    log("cache off: the same prompts")
    records, seconds = run_chats(
        off, n_conv, turns, prompts.replay, sizes.reply_tokens, concurrency
    )
    systems["cache_off"] = system_result(
        records, seconds, prompts, warm, bs, "our engine, prefix caching off"
    )

    log("0 %-hit workload, cache on vs off")
    overhead = zero_hit_overhead(on, off, sizes, seed)
    del on, off
    gc.collect()

    n_hf = min(sizes.hf_conversations, n_conv)
    log(f"transformers generate: {n_hf} conversations, one request at a time")

    hf = load_hf_model(model, dtype)
    pad = pad_token_id(tok)
    run_transformers(hf, prompts, 1, [1], 2, pad)  # warm-up
    records, seconds = run_transformers(hf, prompts, n_hf, turns, sizes.reply_tokens, pad)
    systems["transformers"] = system_result(
        records,
        seconds,
        prompts,
        warm,
        bs,
        f"transformers generate, one request at a time, first {n_hf} conversations",
    )
    del hf
    gc.collect()

    return {
        "kind": "multiturn",
        "environment": {
            "dtype": dtype,
            "quick": quick,
            "model": model,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "concurrency": concurrency,
            "block_size": bs,
        },
        "sizes": asdict(sizes),
        "workload": workload.describe(),
        "systems": systems,
        "hit_vs_fresh": hit,
        "zero_hit_overhead": overhead,
        "ratios": ratios(systems, hit, overhead),
        "total_seconds": time.perf_counter() - started,
    }


def report(result: dict) -> str:
    lines = []
    for name, sys_result in result["systems"].items():
        lines.append(
            summary_table(
                f"{name} ({sys_result['note']})", sys_result["summary"], sys_result["by_turn"]
            )
        )
    r = result["ratios"]
    lines.append(" Ratios ".center(50, "="))
    for name, t in r["targets"].items():
        mark = {True: "met", False: "MISSED", None: "-"}[t["met"]]
        value = "-" if t["value"] is None else f"{t['value']:.3f}"
        lines.append(f"{name:<52}{value:>8}  {mark}")
    p50 = r["ttft_p50_turns_2_plus_s"]
    lines.append(
        "TTFT p50, turns >= 2 (ms): "
        + ", ".join(f"{k} {v * 1000:.1f}" for k, v in p50.items() if v is not None)
    )
    h = result["hit_vs_fresh"]
    alone = [
        ("cache hit", h["hit_ttft_s"]),
        ("fresh suffix", h["fresh_suffix_ttft_s"]),
        ("uncached", h["uncached_ttft_s"]),
    ]
    lines.append(
        "TTFT p50 of one request alone (ms): "
        + ", ".join(f"{k} {v['p50'] * 1000:.1f}" for k, v in alone if v["p50"] is not None)
    )
    o = result["zero_hit_overhead"]
    lines.append(
        f"0 %-hit throughput, cache on / off: {o['on_over_off']:.3f} (paired runs: "
        + ", ".join(f"{x:.3f}" for x in o["paired_on_over_off"])
        + ")"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.parser("multiturn", __doc__)
    cli.add(p, "quick")
    cli.add(p, "dtype", "bfloat16")
    cli.add(p, "model")
    cli.add(p, "threads")
    cli.add(p, "concurrency")
    p.add_argument(
        "--hf-conversations",
        type=cli.positive_int,
        default=None,
        help="conversations transformers replays (default: 4, quick: 2)",
    )
    cli.add(p, "conversations")
    cli.add_chat_shape(p)
    cli.add(p, "seed")
    cli.add(p, "out", DEFAULT_OUT)
    cli.add(p, "plot", DEFAULT_PLOT)
    return p.parse_args(argv)


# Options that override the sizes: dest -> ChatSizes field.
SIZE_OPTIONS = {
    "num_conversations": "conversations",
    "turns": "turns",
    "system_tokens": "system_tokens",
    "user_tokens": "user_tokens",
    "reply_tokens": "reply_tokens",
    "hf_conversations": "hf_conversations",
}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    cli.set_threads(args.threads)
    sizes = replace(QUICK if args.quick else FULL, **cli.overrides(args, SIZE_OPTIONS))
    dtype = cli.engine_dtype(args.dtype)
    result = run(
        sizes, dtype, args.model, args.concurrency, args.seed, args.quick, args.conversations
    )
    print(report(result))
    write_json(args.out, result, log)
    series = {name: s["by_turn"] for name, s in result["systems"].items()}
    w = result["workload"]
    title = f"TTFT by turn: {w['conversations']} chats, {w['requests']} requests"
    if w["name"] == "multiturn":
        title += f", {w['system_tokens']}-token system prompt"
    if plot_ttft_by_turn(series, args.plot, title):
        log(f"wrote {args.plot}")
    return result
