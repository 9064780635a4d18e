"""Benchmark any OpenAI-compatible chat server (ours, vLLM, SGLang, Ollama, ...).

    python -m bench serve --url http://127.0.0.1:8000 --api-key KEY \\
        [--model M] [--workload multiturn|prefix|random | --conversations FILE.jsonl] \\
        [--num-conversations 16] [--turns 6] [--system-tokens 512] [--user-tokens 60] \\
        [--reply-tokens 64] [--concurrency N] [--out bench-results/serve.json] [--plot PNG]

Each request streams (`stream_options.include_usage`). Conversations run
concurrently (at most --concurrency at once), the turns of one conversation one
after another, each turn sending the text the server returned for the earlier ones.
TTFT is stamped at the first chunk with non-empty content, TPOT is (E2E - TTFT) /
(completion tokens - 1), ITL the gaps between content chunks. The cached share
comes from `usage.prompt_tokens_details.cached_tokens` (0 where a server leaves it
out). One warm-up request precedes the timed ones (--no-warmup to skip it): it pays
the first request's one-time costs and puts the shared system prompt in the cache.

The theoretical maximum cached share counts, per request, the tokens before the new
user message (a turn's prompt minus the new message and the template around it, no
more than the previous turn's prompt and reply), in whole blocks of --block-size.
Token counts come from the server's usage; the new message's from a local tokenizer
(--tokenizer; SmolLM2's by default, `none` to count words).
"""

from __future__ import annotations

import argparse
import asyncio
import platform

from bench import cli
from bench import conversations as wl
from bench.http_client import Client, ClientOptions, load_client_tokenizer, measure
from bench.metrics import by_turn, summarize
from bench.report import progress_log, summary_table, write_json
from bench.sizes import CHAT
from bench.ttft_plot import plot_ttft_by_turn
from inference.config import DEFAULT_MODEL

log = progress_log("bench serve", clock=False)


def make_workload(args: argparse.Namespace, tokenizer) -> wl.Workload:
    return wl.build(
        args.workload,
        conversations=args.num_conversations,
        turns=args.turns,
        system_tokens=args.system_tokens,
        user_tokens=args.user_tokens,
        reply_tokens=args.reply_tokens,
        seed=args.seed,
        tokenizer=tokenizer,
        jsonl=args.conversations,
    )


def client_options(args: argparse.Namespace) -> ClientOptions:
    return ClientOptions(
        url=args.url,
        api_key=args.api_key,
        model=args.model,
        timeout=args.timeout,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
    )


async def bench(args: argparse.Namespace) -> dict:
    tokenizer = load_client_tokenizer(args.tokenizer)
    workload = make_workload(args, tokenizer)
    client = Client(client_options(args))
    model = await client.resolve_model()
    log(
        f"{workload.name}: {len(workload.conversations)} conversations, "
        f"{workload.num_requests} requests, model {model!r}"
    )
    concurrency = args.concurrency or len(workload.conversations)
    warmup, records, seconds = await measure(
        client, workload, concurrency, tokenizer, args.block_size, not args.no_warmup
    )
    return {
        "kind": "serve",
        "target": {"url": args.url, "model": model},
        "workload": workload.describe(),
        "settings": {
            "concurrency": concurrency,
            "block_size": args.block_size,
            "temperature": args.temperature,
            "ignore_eos": args.ignore_eos,
            "warmup": not args.no_warmup,
            "tokenizer": args.tokenizer,
        },
        "environment": {"python": platform.python_version(), "client_host": platform.node()},
        "warmup": warmup,
        "summary": summarize(records, seconds),
        "by_turn": by_turn(records),
        "requests": [r.as_dict() for r in records],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.parser("serve", __doc__)
    cli.add(p, "url", required=True)
    cli.add(p, "api_key")
    cli.add(p, "served_model")
    p.add_argument(
        "--workload",
        choices=wl.WORKLOADS,
        default="multiturn",
        help="multiturn, prefix or random (see bench/conversations.py; default: %(default)s)",
    )
    cli.add(p, "conversations")
    cli.add_chat_shape(p, CHAT)
    cli.add(p, "concurrency")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="ask for exactly --reply-tokens tokens (ignore_eos, min_tokens)",
    )
    cli.add(p, "seed")
    p.add_argument(
        "--tokenizer",
        default=DEFAULT_MODEL,
        help="a local Hugging Face folder, the default model's name, or none",
    )
    p.add_argument(
        "--block-size",
        type=cli.positive_int,
        default=16,
        help="KV block size for the theoretical maximum (1 for SGLang's radix cache)",
    )
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    cli.add(p, "out", cli.RESULTS / "serve.json")
    cli.add(p, "plot", None)
    p.add_argument("--label", default=None, help="name of this run in the plot")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = asyncio.run(bench(args))
    print(
        summary_table(
            f"{result['workload']['name']} @ {args.url}", result["summary"], result["by_turn"]
        )
    )
    write_json(args.out, result, log)
    if args.plot:
        label = args.label or result["target"]["model"]
        if plot_ttft_by_turn(
            {label: result["by_turn"]}, args.plot, f"TTFT by turn: {result['workload']['name']}"
        ):
            log(f"wrote {args.plot}")
    return result
