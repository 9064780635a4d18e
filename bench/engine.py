"""The engine benchmark: our engine against transformers on the same weights and prompts.

    python -m bench [engine] [--quick] [--dtype bfloat16|float32] [--out PATH]
                                       [--threads N] [--model PATH] [--rounds N]

Prints one JSON document and writes it (default bench-results/engine.json):
prefill tokens/s, decode tokens/s at 1 and 32 concurrent sequences, each for
our engine and for transformers, and the time to first token of a chat's turn 2
with the prefix cache on and off. Timings use time.perf_counter; every
measurement is preceded by one warm-up of the same batch with shorter prompts.
The throughput measurements run in --rounds paired rounds (default 5): each
ratio is the median round's, and every round is in the JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from bench import cli
from bench.engine_runs import (
    decode_figures,
    engine_config,
    greedy,
    run_engine,
    time_to_first_token,
)
from bench.hf_runs import hf_generate, load_hf_model, pad_token_id
from bench.report import progress_log, write_json
from bench.workloads import (
    FULL,
    QUICK,
    Sizes,
    TokenSource,
    build_conversation,
    chat_prompt_ids,
    next_turn_ids,
)
from inference.config import DEFAULT_MODEL, EngineConfig
from inference.llm_engine import LLMEngine
from inference.loader import resolve_model_path
from inference.sampling_params import SamplingParams

DEFAULT_OUT = cli.RESULTS / "engine.json"


log = progress_log("bench")


# --- workloads -----------------------------------------------------------------
@dataclass
class Prompts:
    prefill: list[list[int]]
    prefill_warmup: list[list[int]]
    decode: dict[int, list[list[int]]]  # concurrency -> prompts
    decode_warmup: dict[int, list[list[int]]]


def make_prompts(tokenizer, sizes: Sizes) -> Prompts:
    """Disjoint slices of text for every measurement, so no timed run can hit the
    prefix cache filled by its warm-up."""
    src = TokenSource(tokenizer)
    n = sizes.prefill_prompts
    return Prompts(
        prefill=src.batch(n, sizes.prefill_len),
        prefill_warmup=src.batch(n, sizes.warmup_len),
        decode={c: src.batch(c, sizes.decode_prompt_len) for c in sizes.decode_concurrency},
        decode_warmup={c: src.batch(c, sizes.warmup_len) for c in sizes.decode_concurrency},
    )


def engine_config_for(
    sizes: Sizes, dtype: str, model: str = DEFAULT_MODEL, prefix_caching: bool = True
) -> EngineConfig:
    """A pool and step budget large enough that nothing is chunked or preempted:
    the numbers then measure the forward, not the scheduler's fallbacks."""
    max_c = max(sizes.decode_concurrency)
    # A chat overshoots its target by up to one paragraph.
    conversation = sizes.conversation_tokens + sizes.reply_tokens + 512
    step_tokens = max(
        sizes.prefill_prompts * sizes.prefill_len,
        max_c * sizes.decode_prompt_len,
        conversation,
    )
    live_tokens = max(
        sizes.prefill_prompts * sizes.prefill_len,
        max_c * (sizes.decode_prompt_len + sizes.decode_new_tokens),
        conversation,
    )
    max_seqs = max(sizes.prefill_prompts, max_c)
    return engine_config(
        model,
        dtype,
        num_blocks=2 * (live_tokens // EngineConfig.block_size + max_seqs) + 64,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=step_tokens,
        enable_prefix_caching=prefix_caching,
    )


# --- our engine ----------------------------------------------------------------
def ours_prefill(engine: LLMEngine, prompts: Prompts) -> dict:
    run_engine(engine, prompts.prefill_warmup, greedy(1))
    engine.reset_prefix_cache()
    run = run_engine(engine, prompts.prefill, greedy(1))
    tokens = sum(len(p) for p in prompts.prefill)
    seconds = run.end - run.start
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        # Must be 0: a hit would make the prefill look cheaper than it is.
        "cached_tokens": sum(o.cached_tokens for o in run.outputs),
    }


def ours_decode(
    engine: LLMEngine,
    prompts: list[list[int]],
    warmup: list[list[int]],
    new_tokens: int,
    warmup_tokens: int,
) -> tuple[dict, list[list[int]]]:
    run_engine(engine, warmup, greedy(warmup_tokens))
    engine.reset_prefix_cache()
    run = run_engine(engine, prompts, greedy(new_tokens))
    assert all(len(o.token_ids) == new_tokens for o in run.outputs)
    figures = decode_figures(len(prompts), new_tokens, run.start, run.first_token, run.end)
    return figures, [o.token_ids for o in run.outputs]


# --- transformers ----------------------------------------------------------------
@torch.inference_mode()
def hf_prefill(model, prompts: Prompts) -> dict:
    # logits_to_keep=1: our engine computes logits for the last position only, and
    # the full [tokens, 49152] projection would add ~25 % to transformers' work.
    model(torch.tensor(prompts.prefill_warmup), logits_to_keep=1)
    x = torch.tensor(prompts.prefill)
    start = time.perf_counter()
    model(x, logits_to_keep=1)
    seconds = time.perf_counter() - start
    return {
        "tokens": x.numel(),
        "seconds": seconds,
        "tokens_per_s": x.numel() / seconds,
        "call": "model(input_ids, logits_to_keep=1)",
    }


def hf_decode(
    model,
    prompts: list[list[int]],
    warmup: list[list[int]],
    new_tokens: int,
    warmup_tokens: int,
    pad_id: int,
) -> tuple[dict, list[list[int]]]:
    hf_generate(model, warmup, warmup_tokens, pad_id)
    start = time.perf_counter()
    clock, out = hf_generate(model, prompts, new_tokens, pad_id)
    end = time.perf_counter()
    assert out.shape[1] == new_tokens
    figures = decode_figures(len(prompts), new_tokens, start, clock.times[1], end)
    return figures, out.tolist()


# --- the two-turn check ----------------------------------------------------------
def two_turn(engine_on: LLMEngine, make_engine_off: Callable[[], LLMEngine], sizes: Sizes) -> dict:
    """TTFT of turn 2 of one conversation, prefix cache on (turn 1 ran on that
    engine) and off (a fresh engine with caching disabled)."""
    tok = engine_on.tokenizer
    engine_on.reset_prefix_cache()  # only turn 1 may feed turn 2's hits
    messages = build_conversation(tok, sizes.conversation_tokens)
    turn1 = chat_prompt_ids(tok, messages)
    # Turn 1 itself warms the cache-on engine up at this prompt length.
    reply = run_engine(
        engine_on, [turn1], SamplingParams(max_tokens=sizes.reply_tokens, temperature=0.0)
    ).outputs[0]
    turn2 = next_turn_ids(
        tok,
        messages,
        turn1,
        reply.token_ids,
        "Thanks. Now list the three most important points, briefly.",
    )
    ttft_on, cached_on = time_to_first_token(engine_on, turn2)

    log("two-turn check: cache-off engine")
    engine_off = make_engine_off()
    time_to_first_token(engine_off, turn1[: sizes.warmup_len])  # warm-up
    ttft_off, cached_off = time_to_first_token(engine_off, turn2)
    del engine_off
    return {
        "turn1_prompt_tokens": len(turn1),
        "reply_tokens": len(reply.token_ids),
        "turn2_prompt_tokens": len(turn2),
        "cache_on": {"ttft_s": ttft_on, "cached_tokens": cached_on},
        "cache_off": {"ttft_s": ttft_off, "cached_tokens": cached_off},
    }


# --- putting it together ---------------------------------------------------------
def match_fraction(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of sequences whose greedy tokens agree exactly (bf16 rounding may split them)."""
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def one_round(engine: LLMEngine, model, sizes: Sizes, prompts: Prompts) -> tuple[dict, dict]:
    """Prefill and decode figures for both sides. Each measurement runs ours, then
    transformers, back to back, so a change in load from other processes on a
    shared machine skews a ratio less than running one side after the other."""
    pad_id = pad_token_id(engine.tokenizer)
    ours: dict = {"prefill": ours_prefill(engine, prompts), "decode": {}}
    hf: dict = {"prefill": hf_prefill(model, prompts), "decode": {}}
    for c in sizes.decode_concurrency:
        args = (prompts.decode[c], prompts.decode_warmup[c])
        n, warm = sizes.decode_new_tokens, sizes.warmup_new_tokens
        ours_fig, ours_ids = ours_decode(engine, *args, n, warm)
        hf_fig, hf_ids = hf_decode(model, *args, n, warm, pad_id)
        ours_fig["greedy_match_vs_transformers"] = match_fraction(ours_ids, hf_ids)
        ours["decode"][str(c)], hf["decode"][str(c)] = ours_fig, hf_fig
    return ours, hf


def throughput_ratios(ours: dict, hf: dict) -> dict:
    out = {
        "prefill_ours_over_transformers": ours["prefill"]["tokens_per_s"]
        / hf["prefill"]["tokens_per_s"]
    }
    for c, fig in ours["decode"].items():
        ref = hf["decode"][c]
        out[f"decode_{c}_ours_over_transformers"] = (
            fig["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
        )
        out[f"decode_{c}_e2e_ours_over_transformers"] = (
            fig["e2e_output_tokens_per_s"] / ref["e2e_output_tokens_per_s"]
        )
    return out


def throughput(
    engine: LLMEngine, model, sizes: Sizes, prompts: Prompts, rounds: int
) -> tuple[dict, dict, list[dict]]:
    """`rounds` paired rounds. For each measurement the figures reported are those of
    the round with the median ratio, so one burst of load on a shared machine moves
    no ratio; every round is kept in the JSON."""
    runs = []
    for r in range(rounds):
        log(f"round {r + 1}/{rounds}: prefill, then decode at {sizes.decode_concurrency}")
        ours, hf = one_round(engine, model, sizes, prompts)
        runs.append({"ours": ours, "transformers": hf, "ratios": throughput_ratios(ours, hf)})

    def median_run(key: str) -> dict:
        return sorted(runs, key=lambda run: run["ratios"][key])[(len(runs) - 1) // 2]

    ours: dict = {"decode": {}}
    hf: dict = {"decode": {}}
    pick = median_run("prefill_ours_over_transformers")
    ours["prefill"], hf["prefill"] = pick["ours"]["prefill"], pick["transformers"]["prefill"]
    for c in map(str, sizes.decode_concurrency):
        pick = median_run(f"decode_{c}_ours_over_transformers")
        ours["decode"][c] = pick["ours"]["decode"][c]
        hf["decode"][c] = pick["transformers"]["decode"][c]
    # Must be 0: the pool is sized so that no sequence is recomputed.
    ours["preemptions"] = engine.scheduler.num_preemptions
    return ours, hf, runs


def ratios(ours: dict, hf: dict, turns: dict) -> dict:
    out = throughput_ratios(ours, hf)
    on, off = turns["cache_on"]["ttft_s"], turns["cache_off"]["ttft_s"]
    out["two_turn_ttft_cache_on_over_off"] = on / off
    out["two_turn_ttft_speedup_off_over_on"] = off / on
    return out


def environment(dtype: str, sizes: Sizes, quick: bool, model: str, rounds: int) -> dict:
    import transformers

    return {
        "dtype": dtype,
        "rounds": rounds,
        "quick": quick,
        "sizes": sizes.as_dict(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "model": str(resolve_model_path(model)),
    }


def run_bench(
    sizes: Sizes,
    dtype: str = "bfloat16",
    quick: bool = False,
    model: str = DEFAULT_MODEL,
    rounds: int = 5,
) -> dict:
    """Every measurement, as one JSON-ready dict."""
    started = time.perf_counter()
    log(f"loading our engine and transformers ({dtype})")
    engine = LLMEngine(engine_config_for(sizes, dtype, model))
    hf_model = load_hf_model(model, dtype)
    prompts = make_prompts(engine.tokenizer, sizes)
    ours, hf, runs = throughput(engine, hf_model, sizes, prompts, rounds)
    del hf_model
    gc.collect()
    log("two-turn check")
    turns = two_turn(
        engine, lambda: LLMEngine(engine_config_for(sizes, dtype, model, False)), sizes
    )
    return {
        "environment": environment(dtype, sizes, quick, model, rounds),
        "ours": ours,
        "transformers": hf,
        "two_turn": turns,
        "ratios": ratios(ours, hf, turns),
        "rounds": runs,
        "total_seconds": time.perf_counter() - started,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    import bench

    p = cli.parser("[engine]", __doc__)
    others = ", ".join(name for name in bench.SUBCOMMANDS if name != "engine")
    p.epilog += f"\n\nThe other commands (python -m bench COMMAND --help): {others}."
    cli.add(p, "dtype", "bfloat16")
    cli.add(p, "out", DEFAULT_OUT)
    cli.add(p, "model")
    cli.add(p, "quick")
    cli.add(p, "rounds", 5)
    cli.add(p, "threads")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    cli.set_threads(args.threads)
    sizes = QUICK if args.quick else FULL
    dtype = cli.engine_dtype(args.dtype)
    result = run_bench(sizes, dtype, args.quick, args.model, args.rounds)
    print(json.dumps(result, indent=2))
    write_json(args.out, result, log)
    return result
