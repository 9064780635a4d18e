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
import json
import os
import platform
import time
from pathlib import Path

from bench import conversations as wl
from bench.metrics import RequestRecord, by_turn, cacheable_tokens, summarize
from bench.report import plot_ttft_by_turn, progress_log, summary_table
from inference.config import DEFAULT_MODEL

DEFAULT_OUT = Path("bench-results/serve.json")


log = progress_log("bench serve", clock=False)


def base_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def load_client_tokenizer(name: str):
    if name == "none":
        return None
    from inference.loader import load_tokenizer

    try:
        return load_tokenizer(name)
    except Exception as exc:  # counting tokens is a nicety; words stand in
        log(f"no tokenizer ({exc}); counting words instead")
        return None


class Client:
    """The HTTP side: one streamed chat completion per call, timed on the client."""

    def __init__(self, args: argparse.Namespace):
        from openai import AsyncOpenAI

        self.args = args
        self.api = AsyncOpenAI(
            base_url=base_url(args.url),
            api_key=args.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            max_retries=0,
            timeout=args.timeout,
        )
        self.model = args.model

    async def resolve_model(self) -> str:
        if not self.model:
            models = await self.api.models.list()
            if not models.data:
                raise SystemExit("the server lists no models: pass --model")
            self.model = models.data[0].id
        return self.model

    async def complete(self, rec: RequestRecord, messages: list[dict], max_tokens: int) -> str:
        """Send one request, fill `rec` in; returns the reply's text."""
        extra: dict = {}
        if self.args.ignore_eos:  # vLLM and SGLang honour these; others ignore them
            extra = {"ignore_eos": True, "min_tokens": max_tokens}
        parts: list[str] = []
        usage = None
        rec.start = time.perf_counter()
        try:
            stream = await self.api.chat.completions.create(
                model=self.model,
                messages=messages,
                max_tokens=max_tokens,
                temperature=self.args.temperature,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra or None,
            )
            async for chunk in stream:
                now = time.perf_counter()
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices or []:
                    text = getattr(choice.delta, "content", None) if choice.delta else None
                    if text:
                        if rec.first_token is None:
                            rec.first_token = now
                        rec.chunk_times.append(now)
                        parts.append(text)
            rec.end = time.perf_counter()
        except Exception as exc:  # a failed request is counted, the run goes on
            rec.end = None
            rec.error = f"{type(exc).__name__}: {exc}"[:300]
        if usage is not None:
            rec.prompt_tokens = usage.prompt_tokens or 0
            rec.completion_tokens = usage.completion_tokens or 0
            details = getattr(usage, "prompt_tokens_details", None)
            rec.cached_tokens = (getattr(details, "cached_tokens", None) or 0) if details else 0
        else:
            rec.completion_tokens = len(rec.chunk_times)  # a lower bound without usage
        if rec.ok and rec.first_token is None:
            rec.error = "no content in the stream"
        return "".join(parts)


async def run_workload(
    client: Client, workload: wl.Workload, concurrency: int
) -> tuple[list, float]:
    """Every conversation, at most `concurrency` at a time; returns (records, seconds)."""
    queue: asyncio.Queue[wl.Conversation] = asyncio.Queue()
    for conv in workload.conversations:
        queue.put_nowait(conv)
    records: list[RequestRecord] = []
    total = workload.num_requests

    async def worker() -> None:
        while True:
            try:
                conv = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            replies: list[str] = []
            for k in range(len(conv.turns)):
                rec = RequestRecord(conversation=conv.index, turn=k + 1, start=0.0)
                reply = await client.complete(rec, conv.messages(replies), workload.reply_tokens)
                records.append(rec)
                if len(records) % max(1, total // 10) == 0:
                    log(f"{len(records)}/{total} requests")
                if not rec.ok:
                    break  # the later turns need this reply
                replies.append(reply)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return records, time.perf_counter() - start


def fill_max_cached(
    records: list[RequestRecord],
    workload: wl.Workload,
    overhead: int,
    block_size: int,
    warmed: bool = True,
) -> None:
    """Set each record's theoretical ceiling from the token counts (see the module doc)."""
    by_key = {(r.conversation, r.turn): r for r in records}
    for r in records:
        if not r.ok:
            continue
        conv = workload.conversations[r.conversation]
        new = conv.turns[r.turn - 1].user_tokens + overhead
        if r.turn == 1:
            history = None if workload.system_seen_before(r.conversation, warmed) else 0
        else:
            prev = by_key.get((r.conversation, r.turn - 1))
            # The previous reply's last token is never fed back, so its KV never exists.
            history = prev.prompt_tokens + prev.completion_tokens - 1
        r.max_cached_tokens = cacheable_tokens(r.prompt_tokens, new, history, block_size)


def make_workload(args: argparse.Namespace, tokenizer) -> wl.Workload:
    if args.conversations:
        return wl.load_jsonl(
            args.conversations, args.reply_tokens, tokenizer, args.num_conversations
        )
    return wl.build(
        args.workload,
        conversations=args.num_conversations,
        turns=args.turns,
        system_tokens=args.system_tokens,
        user_tokens=args.user_tokens,
        reply_tokens=args.reply_tokens,
        seed=args.seed,
        tokenizer=tokenizer,
    )


async def measure(
    client: Client,
    workload: wl.Workload,
    concurrency: int,
    tokenizer,
    block_size: int,
    warmup: bool = True,
) -> tuple[dict | None, list[RequestRecord], float]:
    """The optional warm-up request, then the workload; each record gets its theoretical
    ceiling. Returns (the warm-up's record as a dict or None, records in order, seconds)."""
    warm = None
    if warmup:
        rec = RequestRecord(conversation=-1, turn=0, start=0.0)
        await client.complete(rec, workload.warmup_messages(), 4)
        warm = rec.as_dict()
        if not rec.ok:
            log(f"warm-up failed: {rec.error}")
    records, seconds = await run_workload(client, workload, concurrency)
    records.sort(key=lambda r: (r.conversation, r.turn))
    fill_max_cached(
        records,
        workload,
        wl.template_overhead(tokenizer),
        block_size,
        warmed=warm is not None and warm["ok"],
    )
    return warm, records, seconds


async def bench(args: argparse.Namespace) -> dict:
    tokenizer = load_client_tokenizer(args.tokenizer)
    workload = make_workload(args, tokenizer)
    client = Client(args)
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
    p = argparse.ArgumentParser(
        prog="python -m bench serve",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 2)[2],
    )
    p.add_argument("--url", required=True, help="the server's base URL (with or without /v1)")
    p.add_argument("--api-key", default=None, help="default: $OPENAI_API_KEY")
    p.add_argument("--model", default=None, help="default: the first of /v1/models")
    p.add_argument("--workload", choices=wl.WORKLOADS, default="multiturn")
    p.add_argument(
        "--conversations",
        type=Path,
        default=None,
        help="JSONL of message lists, replayed instead of --workload",
    )
    p.add_argument(
        "--num-conversations",
        type=int,
        default=16,
        help="conversations (multiturn) or requests (prefix, random); "
        "with --conversations, how many lines to use at most",
    )
    p.add_argument("--turns", type=int, default=6, help="user turns per conversation (multiturn)")
    p.add_argument(
        "--system-tokens",
        type=int,
        default=512,
        help="the shared system prompt (multiturn), the shared prefix (prefix), "
        "each request's own system prompt (random)",
    )
    p.add_argument("--user-tokens", type=int, default=60)
    p.add_argument("--reply-tokens", type=int, default=64, help="max_tokens of every request")
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="conversations in flight (default: all of them)",
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="ask for exactly --reply-tokens tokens (ignore_eos, min_tokens)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tokenizer",
        default=DEFAULT_MODEL,
        help="a local Hugging Face folder, the default model's name, or none",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="KV block size for the theoretical maximum (1 for SGLang's radix cache)",
    )
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--plot", type=Path, default=None, help="PNG of TTFT by turn")
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")
    if args.plot:
        label = args.label or result["target"]["model"]
        if plot_ttft_by_turn(
            {label: result["by_turn"]}, args.plot, f"TTFT by turn: {result['workload']['name']}"
        ):
            log(f"wrote {args.plot}")
    return result
