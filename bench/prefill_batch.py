"""Many short prompts prefilled in one step: attention per sequence against one
batched call, and transformers' padded batch, on the same weights and prompts.

    python -m bench prefill-batch [--prompts 32] [--tokens 16] [--rounds 7]
                                  [--dtype bfloat16|float32] [--threads N] [--out PATH]
                                  [--scores auto|held-whole|flash]

Each round times one engine step that prefills every prompt (prefix cache reset,
so nothing hits), with the short chunks' attention batched and with it forced per
sequence (kernels.attention._BATCH_MAX_QUERY = 0), and transformers' forward over
the same batch (model(ids, logits_to_keep=1)); the attention alone is timed too,
over the step's metadata, once per layer. Medians over the rounds. Prints one JSON
document and writes it (default bench-results/prefill_batch.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import kernels.attention as attention
from bench import cli
from bench.engine_runs import engine_config, greedy, run_engine
from bench.hf_runs import load_hf_model
from bench.report import progress_log, write_json
from bench.workloads import TokenSource
from inference.llm_engine import LLMEngine

DEFAULT_OUT = cli.RESULTS / "prefill_batch.json"

log = progress_log("prefill-batch")


_BATCHED_MAX_QUERY = attention._BATCH_MAX_QUERY


def per_sequence(on: bool) -> None:
    """Force (True) or restore (False) one attention call per prefilling sequence."""
    attention._BATCH_MAX_QUERY = 0 if on else _BATCHED_MAX_QUERY


def time_step(engine: LLMEngine, prompts: list[list[int]]) -> float:
    engine.reset_prefix_cache()
    run = run_engine(engine, prompts, greedy(1))
    assert sum(o.cached_tokens for o in run.outputs) == 0
    return run.first_token - run.start


def time_attention(engine: LLMEngine, prompts: list[list[int]]) -> float:
    """Seconds of paged_attention for the step's prefill, summed over the layers:
    the prompts are scheduled and stored once, then attention alone is re-run."""
    engine.reset_prefix_cache()
    ids = [f"attn-{i}-{time.perf_counter_ns()}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts, strict=True):
        engine.add_request(rid, p, greedy(1))
    sched = engine.scheduler.schedule()
    runner = engine.runner
    _, _, meta, _ = runner.prepare(sched.seqs, sched.num_tokens)
    model = runner.model
    heads, dim = engine.model_config.num_attention_heads, model.head_dim
    q = torch.randn(meta.query_start_loc[-1], heads, dim, dtype=runner.dtype)
    layers = runner.kv_cache.shape[1]
    with torch.inference_mode():
        start = time.perf_counter()
        for layer in range(layers):
            attention.paged_attention(
                q, runner.kv_cache[0, layer], runner.kv_cache[1, layer], meta, dim**-0.5
            )
        seconds = time.perf_counter() - start
    for rid in ids:
        engine.abort(rid)
    return seconds


@torch.inference_mode()
def time_hf(model, prompts: list[list[int]]) -> float:
    x = torch.tensor(prompts)  # equal lengths: the padded batch has no padding
    start = time.perf_counter()
    model(x, logits_to_keep=1)
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> dict:
    cli.set_threads(args.threads)
    if args.scores != "auto":  # the path this CPU would not take, timed here anyway
        held = {torch.bfloat16, torch.float32} if args.scores == "held-whole" else set()
        attention._HELD_WHOLE_DTYPES = frozenset(held)
    config = engine_config(
        args.model,
        args.dtype,
        num_blocks=4 * args.prompts * (-(-args.tokens // 16) + 1) + 64,
        max_num_seqs=args.prompts,
        max_num_batched_tokens=max(256, args.prompts * args.tokens),
    )
    engine = LLMEngine(config)
    src = TokenSource(engine.tokenizer)
    hf = load_hf_model(args.model, args.dtype)
    warm = src.batch(args.prompts, args.tokens)
    time_step(engine, warm), time_hf(hf, warm)
    rows: dict[str, list[float]] = {k: [] for k in (
        "batched_s", "per_sequence_s", "transformers_s", "attention_batched_s",
        "attention_per_sequence_s")}
    for r in range(args.rounds):
        prompts = src.batch(args.prompts, args.tokens)
        per_sequence(False)
        rows["batched_s"].append(time_step(engine, prompts))
        rows["attention_batched_s"].append(time_attention(engine, prompts))
        per_sequence(True)
        rows["per_sequence_s"].append(time_step(engine, prompts))
        rows["attention_per_sequence_s"].append(time_attention(engine, prompts))
        per_sequence(False)
        rows["transformers_s"].append(time_hf(hf, prompts))
        log(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{k} {v[-1] * 1e3:.1f} ms" for k, v in rows.items()))
    med = {k: statistics.median(v) for k, v in rows.items()}
    tokens = args.prompts * args.tokens
    return {
        "prompts": args.prompts,
        "tokens_per_prompt": args.tokens,
        "dtype": config.dtype,
        "threads": torch.get_num_threads(),
        "scores": args.scores,
        "scores_held_whole": torch.bfloat16 in attention._HELD_WHOLE_DTYPES,
        "median_seconds": med,
        "tokens_per_s": {k: tokens / v for k, v in med.items() if not k.startswith("attention")},
        "batched_vs_per_sequence": med["per_sequence_s"] / med["batched_s"],
        "batched_vs_transformers": med["transformers_s"] / med["batched_s"],
        "attention_speedup": med["attention_per_sequence_s"] / med["attention_batched_s"],
        "rounds": rows,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.parser("prefill-batch", __doc__)
    p.add_argument("--prompts", type=cli.positive_int, default=32, help="prompts in the step")
    cli.add(p, "prompt_tokens", 16)
    cli.add(p, "rounds", 7)
    cli.add(p, "dtype")
    cli.add(p, "threads")
    p.add_argument("--scores", choices=("auto", "held-whole", "flash"), default="auto",
                   help="force the per-sequence CPU attention path (auto: this CPU's; "
                        "held-whole is that of bf16 CPUs without AMX); the batched call "
                        "holds its scores whole on any CPU")
    cli.add(p, "model")
    cli.add(p, "out", DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    args.dtype = cli.engine_dtype(args.dtype)
    result = run(args)
    write_json(args.out, result, log)
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    return result
