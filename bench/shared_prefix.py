"""New conversations that arrive together on a shared system prompt: their turn-0
time to first token on a fresh engine (nothing cached) against a warm one (the
system prompt cached by an earlier request), in-process.

    python -m bench shared-prefix [--num-conversations 16] [--system-tokens 512]
        [--user-tokens 60] [--reply-tokens 16] [--rounds 3] [--step-budget N] [--dtype ...]
        [--threads N] [--model PATH] [--out bench-results/shared_prefix.json]

Each round, on one engine with the default step budget (256 tokens on CPU), the
prefix cache is reset and the conversations' first turns are added at once:
"fresh" as is; "fresh_no_wait" with the scheduler's in-flight prefix waiting
turned off (every request admitted before the prompt's blocks are cached computes
them again: the behaviour before inference/inflight.py); "warm" after one request
with the same system prompt has put it in the cache. Figures: TTFT p50 and p90 per
case (the median over rounds), prompt tokens computed, and fresh / warm (target:
within 1.5x). Prints one JSON document and writes it.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from bench import cli
from bench import conversations as wl
from bench.engine_runs import engine_config, greedy, run_engine
from bench.metrics import percentile
from bench.report import progress_log, write_json
from bench.sizes import CHAT
from bench.workloads import chat_prompt_ids
from inference.llm_engine import LLMEngine
from inference.loader import load_tokenizer

DEFAULT_OUT = cli.RESULTS / "shared_prefix.json"


log = progress_log("shared-prefix")


def ttfts(engine: LLMEngine, prompts: list[list[int]], reply_tokens: int) -> list[float]:
    """Add every prompt at once and step until all finish; each one's TTFT."""
    run = run_engine(engine, prompts, greedy(reply_tokens))
    return [t - run.start for t in run.first_tokens]


def one_case(engine: LLMEngine, prompts, reply_tokens: int, warm: list[int] | None,
             wait: bool) -> dict:
    engine.reset_prefix_cache()
    if warm is not None:
        engine.generate([warm], greedy(1))
    kv = engine.kv
    queries, hits = kv.prefix_cache_queries, kv.prefix_cache_hits
    if not wait:
        engine.scheduler._inflight = lambda out: None  # an instance attribute, removed below
    try:
        times = ttfts(engine, prompts, reply_tokens)
    finally:
        if not wait:
            del engine.scheduler._inflight
    computed = (kv.prefix_cache_queries - queries) - (kv.prefix_cache_hits - hits)
    return {
        "ttft_p50_s": percentile(times, 50),
        "ttft_p90_s": percentile(times, 90),
        "ttft_max_s": max(times),
        "prompt_tokens_computed": computed,
    }


def run(args: argparse.Namespace) -> dict:
    cli.set_threads(args.threads)
    tok = load_tokenizer(args.model)
    n = args.num_conversations
    workload = wl.multiturn(n, 1, args.system_tokens, args.user_tokens, args.reply_tokens,
                            args.seed, tok)
    prompts = [chat_prompt_ids(tok, c.messages([])) for c in workload.conversations]
    warm = chat_prompt_ids(tok, workload.warmup_messages())
    per_request = max(map(len, prompts)) + args.reply_tokens
    config = engine_config(
        args.model,
        args.dtype,
        num_blocks=2 * n * (per_request // 16 + 2) + 64,
        max_num_seqs=n,
        max_num_batched_tokens=args.step_budget,
    )
    engine = LLMEngine(config, tok)
    log(f"{n} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} "
        f"tokens, step budget {config.max_num_batched_tokens}, {config.dtype}")
    one_case(engine, prompts[:2], 2, warm, True)  # loads what a first request loads
    cases = {"fresh": (None, True), "fresh_no_wait": (None, False), "warm": (warm, True)}
    rounds: dict[str, list[dict]] = {k: [] for k in cases}
    for r in range(args.rounds):
        for name, (warm_prompt, wait) in cases.items():
            rounds[name].append(one_case(engine, prompts, args.reply_tokens, warm_prompt, wait))
        log(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{k} p50 {v[-1]['ttft_p50_s']:.2f} s ({v[-1]['prompt_tokens_computed']} tokens)"
            for k, v in rounds.items()))
    med = {
        name: {key: statistics.median(x[key] for x in runs) for key in runs[0]}
        for name, runs in rounds.items()
    }
    return {
        "conversations": n,
        "system_tokens": args.system_tokens,
        "prompt_tokens": [len(p) for p in prompts],
        "step_budget": config.max_num_batched_tokens,
        "dtype": config.dtype,
        "threads": torch.get_num_threads(),
        "median": med,
        "fresh_over_warm_p50": med["fresh"]["ttft_p50_s"] / med["warm"]["ttft_p50_s"],
        "fresh_no_wait_over_warm_p50": (
            med["fresh_no_wait"]["ttft_p50_s"] / med["warm"]["ttft_p50_s"]
        ),
        "target_fresh_over_warm": 1.5,
        "rounds": rounds,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.parser("shared-prefix", __doc__)
    cli.add_chat_shape(p, CHAT, ("num_conversations", "system_tokens", "user_tokens"))
    cli.add(p, "reply_tokens", 16)
    cli.add(p, "rounds", 3)
    p.add_argument("--step-budget", type=cli.positive_int, default=None,
                   help="max_num_batched_tokens (default: the engine's, 256 on CPU)")
    cli.add(p, "seed")
    cli.add(p, "dtype")
    cli.add(p, "threads")
    cli.add(p, "model")
    cli.add(p, "out", DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run(args)
    write_json(args.out, result, log)
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    return result
