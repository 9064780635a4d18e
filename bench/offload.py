"""The host/disk KV tier: a pool too small for the chats, with the tier off and on,
against an unbounded pool; a restart on a kept kv_dir against a cold start; and the
cost of restoring blocks against recomputing them.

    python -m bench offload [--quick] [--dtype bfloat16|float32] [--threads N]
        [--model PATH] [--out bench-results/offload.json]
        [--num-conversations N] [--turns T] [--pool-conversations P] [--concurrency C]

Sizes: 16 conversations x 4 turns, system prompt 512 tokens, user turns 60, replies
32 (--quick: 8 x 3, 128, 24, 8).

1. Chats in rounds: turn 1 of every conversation (C at a time), then turn 2 of every
   conversation, and so on, so that between two turns of one conversation all the
   others run. The same prompts (built on the first engine from its replies, replayed
   on the others) on: an unbounded pool; a pool that holds about P conversations'
   whole histories (P=4 of 16) with the tier off; the same pool with a 1 GiB host tier.
   TTFT p50 of turns >= 2 and the cached share of their prompt tokens.
2. Restart: an engine with kv_dir serves turn 1 of C conversations and closes; a new
   engine on the same kv_dir serves their turn 2 one at a time, and so does a cold
   engine; TTFT p50 of each.
3. Restore vs recompute: a prompt of B whole blocks is computed, evicted to the tier,
   then brought back by prewarm (from memory, and from disk with no memory tier); the
   same blocks computed afresh on a reset engine. Seconds per block, median of repeats.

Goals: with the tier on, the cached share of turns >= 2 within 2 points of the
unbounded pool; a restore costs <= 0.25 x recomputing.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import tempfile
import time
from dataclasses import asdict, dataclass, replace

import torch

from bench import cli
from bench import conversations as wl
from bench.chat_runs import ChatPrompts, note_output, system_result
from bench.engine_runs import engine_config, greedy, time_to_first_token, warm_up
from bench.metrics import RequestRecord, percentile, stats
from bench.report import progress_log, write_json
from bench.sizes import CHAT, QUICK_CHAT
from bench.workloads import chat_prompt_ids
from inference.llm_engine import LLMEngine

DEFAULT_OUT = cli.RESULTS / "offload.json"
_ids = itertools.count()


log = progress_log("offload")


@dataclass(frozen=True)
class Sizes:
    conversations: int
    turns: int
    system_tokens: int
    user_tokens: int
    reply_tokens: int
    pool_conversations: int  # the small pool holds about this many whole conversations
    concurrency: int
    restore_blocks: int
    repeats: int


# The chat shape's system prompt and user turns (bench/sizes.py), with 4 turns of
# 32-token replies; --quick: the quick shape's, over 8 conversations.
FULL = Sizes(CHAT.conversations, 4, CHAT.system_tokens, CHAT.user_tokens, 32, 4, 4,
             restore_blocks=32, repeats=5)
QUICK = Sizes(8, 3, QUICK_CHAT.system_tokens, QUICK_CHAT.user_tokens, QUICK_CHAT.reply_tokens,
              2, 2, restore_blocks=8, repeats=3)


# --- 1. chats in rounds --------------------------------------------------------
def run_rounds(engine: LLMEngine, sizes: Sizes, prompt_for, replies: dict | None) -> tuple[list, float]:
    """Turn t of every conversation, `concurrency` at a time, before turn t + 1."""
    records: list[RequestRecord] = []
    params = greedy(sizes.reply_tokens)
    began = time.perf_counter()
    prev: dict[int, tuple[list[int], list[int]]] = {}
    for turn in range(1, sizes.turns + 1):
        for first in range(0, sizes.conversations, sizes.concurrency):
            group = range(first, min(first + sizes.concurrency, sizes.conversations))
            active: dict[str, tuple[RequestRecord, list[int]]] = {}
            for conv in group:
                prompt = prompt_for(conv, turn, prev.get(conv))
                rid = f"offload-{next(_ids)}"
                rec = RequestRecord(conversation=conv, turn=turn, start=time.perf_counter(),
                                    prompt_tokens=len(prompt))
                engine.add_request(rid, prompt, params)
                active[rid] = (rec, prompt)
            while engine.has_unfinished_requests():
                outs = engine.step()
                now = time.perf_counter()
                for out in outs:
                    rec, prompt = active[out.request_id]
                    if note_output(rec, out, now):
                        records.append(rec)
                        prev[rec.conversation] = (prompt, out.token_ids)
                        if replies is not None:
                            replies[(rec.conversation, rec.turn)] = out.token_ids
    return records, time.perf_counter() - began


def pool_blocks_for(prompts: ChatPrompts, sizes: Sizes, block_size: int) -> int:
    """Blocks that hold `pool_conversations` whole conversations at their last turn."""
    longest = max(len(prompts.recorded[(c, sizes.turns)]) for c in range(sizes.conversations))
    per_conv = -(-(longest + sizes.reply_tokens) // block_size) + 1
    return sizes.pool_conversations * per_conv


def chats(model: str, dtype: str, sizes: Sizes, tok, seed: int) -> dict:
    workload = wl.multiturn(sizes.conversations, sizes.turns, sizes.system_tokens,
                            sizes.user_tokens, sizes.reply_tokens, seed, tok)
    prompts = ChatPrompts(tok, workload)
    warm = chat_prompt_ids(tok, workload.warmup_messages())
    seqs = sizes.concurrency
    total = sizes.conversations * (sizes.system_tokens + sizes.turns * (
        sizes.user_tokens + sizes.reply_tokens + 32)) // 16 + 256
    systems, engines = {}, {}
    log(f"unbounded pool ({total} blocks): {sizes.conversations} chats x {sizes.turns} turns")
    big = LLMEngine(engine_config(model, dtype, total, seqs), tok)
    warm_up(big, warm)
    records, seconds = run_rounds(big, sizes, prompts.build, prompts.replies)
    bs = big.config.block_size
    systems["unbounded_pool"] = system_result(records, seconds, prompts, warm, bs,
                                              f"a pool of {total} blocks: nothing evicted")
    engines["unbounded_pool"] = big.metrics_snapshot()
    del big
    gc.collect()
    small = pool_blocks_for(prompts, sizes, bs)
    for name, tier in (("tier_off", 0), ("tier_on", 1 << 30)):
        log(f"pool of {small} blocks (about {sizes.pool_conversations} conversations), "
            f"{name.replace('_', ' ')}")
        engine = LLMEngine(engine_config(model, dtype, small, seqs, kv_offload_bytes=tier), tok)
        warm_up(engine, warm)
        records, seconds = run_rounds(engine, sizes, prompts.replay, None)
        systems[name] = system_result(records, seconds, prompts, warm, bs,
                                      f"a pool of {small} blocks, host tier "
                                      + ("1 GiB" if tier else "off"))
        engines[name] = engine.metrics_snapshot()
        del engine
        gc.collect()
    out = {}
    for name, s in systems.items():
        out[name] = {
            "ttft_p50_turns_2_plus_s": s["turns_2_plus"]["ttft_s"]["p50"],
            "cached_share_turns_2_plus": s["turns_2_plus"]["cached_share"],
            "cached_share_of_max": s["summary"]["cached_share_of_max"],
            "evictions": engines[name]["evictions"],
            "prefix_cache_hits_tier": engines[name].get("prefix_cache_hits_tier", 0),
            "kv_tier_restores": engines[name].get("kv_tier_restores", 0),
            "kv_tier_offloads": engines[name].get("kv_tier_offloads", 0),
            "miss_reasons": engines[name].get("prefix_cache_miss_reasons", {}),
        }
    return {"pool_blocks": small, "unbounded_blocks": total, "figures": out, "systems": systems}


# --- 2. restart ------------------------------------------------------------------
def restart(model: str, dtype: str, sizes: Sizes, tok, seed: int) -> dict:
    n = sizes.concurrency
    workload = wl.multiturn(n, 2, sizes.system_tokens, sizes.user_tokens, sizes.reply_tokens,
                            seed + 1, tok)
    prompts = ChatPrompts(tok, workload)
    blocks = 4 * n * (sizes.system_tokens + 2 * (sizes.user_tokens + sizes.reply_tokens + 32)) // 16
    other = tok.encode("An unrelated warm-up request.")
    with tempfile.TemporaryDirectory(prefix="kv-") as kv_dir:
        log(f"restart: turn 1 of {n} chats on an engine with kv_dir, then close it")
        first = LLMEngine(
            engine_config(model, dtype, blocks, n, kv_offload_bytes=1 << 30, kv_dir=kv_dir), tok
        )
        sizes1 = replace(sizes, conversations=n, turns=1)
        run_rounds(first, sizes1, prompts.build, prompts.replies)
        first.close()
        del first
        gc.collect()
        result = {}
        for name, kw in (("restarted", {"kv_offload_bytes": 1 << 30, "kv_dir": kv_dir}),
                         ("cold", {})):
            engine = LLMEngine(engine_config(model, dtype, blocks, n, **kw), tok)
            warm_up(engine, other)
            ttfts, cached = [], []
            for conv in range(n):
                prev = (prompts.recorded[(conv, 1)], prompts.replies[(conv, 1)])
                ids = prompts.recorded.get((conv, 2)) or prompts.build(conv, 2, prev)
                t, c = time_to_first_token(engine, ids)
                ttfts.append(t)
                cached.append(c / len(ids))
            result[name] = {"turn2_ttft_s": stats(ttfts), "cached_share_mean": sum(cached) / n}
            log(f"  {name}: turn-2 TTFT p50 {result[name]['turn2_ttft_s']['p50'] * 1000:.1f} ms")
            del engine
            gc.collect()
    return result


# --- 3. restore vs recompute ---------------------------------------------------
def restore_cost(model: str, dtype: str, sizes: Sizes, tok, seed: int) -> dict:
    b = sizes.restore_blocks
    blocks = 4 * b + 8
    gen = torch.Generator().manual_seed(seed)
    with tempfile.TemporaryDirectory(prefix="kv-") as kv_dir:
        engines = {
            "memory": LLMEngine(engine_config(model, dtype, blocks, 4, kv_offload_bytes=1 << 30), tok),
            "disk": LLMEngine(engine_config(model, dtype, blocks, 4, kv_dir=kv_dir), tok),
        }
        times: dict[str, list[float]] = {"memory": [], "disk": [], "recompute": []}
        for _ in range(sizes.repeats):
            ids = torch.randint(100, 40000, (b * 16 + 1,), generator=gen).tolist()
            for name, engine in engines.items():
                engine.reset_prefix_cache()
                t_compute, _ = time_to_first_token(engine, ids)  # computes the b blocks
                if name == "memory":
                    times["recompute"].append(t_compute)
                filler = torch.randint(100, 40000, (blocks * 16 - 8,), generator=gen).tolist()
                time_to_first_token(engine, filler)  # evicts every cached block to the tier
                began = time.perf_counter()
                n = engine.prewarm(ids, max_blocks=b)
                took = time.perf_counter() - began
                if n != b:
                    raise RuntimeError(f"prewarm restored {n} of {b} blocks ({name})")
                times[name].append(took)
    per_block = {k: percentile(v, 50) / b for k, v in times.items()}
    return {
        "blocks": b,
        "seconds": times,
        "per_block_s": per_block,
        "memory_over_recompute": per_block["memory"] / per_block["recompute"],
        "disk_over_recompute": per_block["disk"] / per_block["recompute"],
    }


# --- report --------------------------------------------------------------------
def targets(result: dict) -> dict:
    f = result["chats"]["figures"]
    gap = f["unbounded_pool"]["cached_share_turns_2_plus"] - f["tier_on"]["cached_share_turns_2_plus"]
    ratio = result["restore"]["memory_over_recompute"]
    return {
        "cached share, tier on, within 2 points of an unbounded pool": {
            "value": gap * 100, "met": gap <= 0.02},
        "restore from memory <= 0.25 x recompute": {"value": ratio, "met": ratio <= 0.25},
    }


def report(result: dict) -> str:
    f = result["chats"]["figures"]
    lines = [" KV tier: chats in rounds ".center(72, "="),
             f"{'system':<16}{'TTFT p50 t>=2 ms':>18}{'cached t>=2':>13}{'evictions':>11}"
             f"{'tier hits':>11}"]
    for name, x in f.items():
        lines.append(f"{name:<16}{x['ttft_p50_turns_2_plus_s'] * 1000:>18.1f}"
                     f"{x['cached_share_turns_2_plus'] * 100:>12.1f}%{x['evictions']:>11}"
                     f"{x['prefix_cache_hits_tier']:>11}")
    lines.append(f"pool {result['chats']['pool_blocks']} blocks vs unbounded "
                 f"{result['chats']['unbounded_blocks']}")
    r = result["restart"]
    lines.append(" restart ".center(72, "="))
    for name, x in r.items():
        lines.append(f"{name:<16} turn-2 TTFT p50 {x['turn2_ttft_s']['p50'] * 1000:8.1f} ms, "
                     f"cached {x['cached_share_mean'] * 100:5.1f}%")
    c = result["restore"]
    lines.append(f" restore vs recompute ({c['blocks']} blocks) ".center(72, "="))
    for name, s in c["per_block_s"].items():
        lines.append(f"{name:<16}{s * 1e6:10.1f} us/block")
    lines.append(f"memory / recompute {c['memory_over_recompute']:.3f}, "
                 f"disk / recompute {c['disk_over_recompute']:.3f}")
    lines.append(" goals ".center(72, "="))
    for name, t in result["targets"].items():
        lines.append(f"{name:<62}{t['value']:>7.3f}  {'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.parser("offload", __doc__)
    cli.add(p, "quick")
    cli.add(p, "dtype")
    cli.add(p, "model")
    cli.add(p, "threads")
    cli.add_chat_shape(p, names=("num_conversations", "turns"))
    p.add_argument(
        "--pool-conversations",
        type=cli.positive_int,
        default=None,
        help=f"whole conversations the small pool holds (default: {cli.FROM_SIZES})",
    )
    cli.add(p, "concurrency", default_text=cli.FROM_SIZES)
    cli.add(p, "seed")
    cli.add(p, "out", DEFAULT_OUT)
    return p.parse_args(argv)


# Options that override the sizes: dest -> Sizes field.
SIZE_OPTIONS = {
    "num_conversations": "conversations",
    "turns": "turns",
    "pool_conversations": "pool_conversations",
    "concurrency": "concurrency",
}


def main(argv: list[str] | None = None) -> dict:
    from inference.loader import load_tokenizer

    args = parse_args(argv)
    cli.set_threads(args.threads)
    sizes = replace(QUICK if args.quick else FULL, **cli.overrides(args, SIZE_OPTIONS))
    dtype = cli.engine_dtype(args.dtype)
    tok = load_tokenizer(args.model)
    started = time.perf_counter()
    result = {
        "kind": "offload",
        "environment": {"dtype": dtype, "model": args.model, "quick": args.quick,
                        "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        "sizes": asdict(sizes),
        "chats": chats(args.model, dtype, sizes, tok, args.seed),
        "restart": restart(args.model, dtype, sizes, tok, args.seed),
        "restore": restore_cost(args.model, dtype, sizes, tok, args.seed),
    }
    result["targets"] = targets(result)
    result["total_seconds"] = time.perf_counter() - started
    print(report(result))
    write_json(args.out, result, log)
    return result
