"""Conversations longer than the context, turn after turn, served three ways:

  ours       our server; the client sends its whole history back every turn with
             `truncation: "auto"`, and the prompt manager leaves out the oldest whole
             turns in large steps behind a fixed marker (docs/prompts.md)
  trimming   our server; the client keeps the system message and the newest messages
             that fit the last K tokens (K: the context less the reply and a margin),
             dropping the oldest message by message every turn, as clients that trim each
             prompt to the context do (Ollama drops the front of every prompt)
  llamacpp   llama.cpp's llama-server with --context-shift (where one is built: `python
             -m bench llamacpp build`; --isa picks the build). It refuses a prompt longer
             than its context (the shift acts while it generates), so its client trims
             as `trimming` does

    python -m bench long-chat [--turns 200] [--context 8192] [--reply-tokens 128]
        [--num-conversations 1] [--runs ours,trimming,llamacpp] [--isa native|avx2]
        [--llama-server PATH] [--threads 2] [--seed 0] [--out bench-results/long-chat.json]

Each run gets a freshly started server with that context (ours: LLM_MAX_MODEL_LEN; llama:
-c) and one slot, and the same conversations: user messages of ShareGPT-like lengths
(mostly a sentence or a paragraph, now and then a long paste), greedy replies of at most
--reply-tokens. Per run it reports the cached share of all prompt tokens, TTFT p50/p90
(and per turn in the JSON), output tokens/s after the first token, and full recomputes:
turns whose cached tokens fell below 90 % of what the previous turn left cacheable (its
prompt and reply, in whole 16-token blocks, less one). For ours, also the cuts the
responses reported (`truncation.turns_left_out` moving). Then ours' TTFT p90 over each
other run's, same run. The machine's load moves every figure: compare within a run.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from bench import cli
from bench import conversations as wl
from bench import llamacpp_build as lb
from bench.http_client import base_url, load_client_tokenizer
from bench.metrics import RequestRecord, stats
from bench.report import progress_log, write_json
from bench.servers import SERVED_NAME, Server, ServerSettings, start_llama_server, start_ours
from inference.config import DEFAULT_MODEL

DEFAULT_OUT = cli.RESULTS / "long-chat.json"
RUNS = ("ours", "trimming", "llamacpp")
BLOCK = 16
MISS_BELOW = 0.9  # of the previous turn's cacheable tokens: a full recompute
# ShareGPT-like user turns: mostly short, sometimes a paragraph, now and then a paste.
USER_TOKENS = (12, 20, 30, 45, 60, 90, 140, 260, 420)
USER_WEIGHTS = (14, 16, 16, 14, 12, 10, 8, 6, 4)
SYSTEM = "You are a helpful assistant. Answer the user's questions clearly and briefly."
MESSAGE_OVERHEAD = 5  # a message's role markers, about, in the chat formats served
TRIM_MARGIN = 64

log = progress_log("bench long-chat")


def user_texts(seed: int, conversation: int, turns: int, count) -> list[str]:
    """The conversation's user messages (the same for every run)."""
    rng = wl.seeded_rng(seed, "long-chat", conversation)
    sizes = rng.choices(USER_TOKENS, USER_WEIGHTS, k=turns)
    texts = [wl.make_text(random.Random(rng.random()), n, count)[0] for n in sizes]
    return [f"{i + 1}. {text}?" for i, text in enumerate(texts)]


def trimmed(messages: list[dict], budget: int, count) -> list[dict]:
    """The system message and the newest messages whose tokens fit `budget`."""
    sizes = [count(m["content"]) + MESSAGE_OVERHEAD for m in messages]
    keep = [messages[0]]
    total = sizes[0]
    tail: list[dict] = []
    for message, size in zip(reversed(messages[1:]), reversed(sizes[1:]), strict=True):
        if total + size > budget and tail:
            break
        tail.append(message)
        total += size
    return keep + tail[::-1]


def ask(api, model: str, messages: list[dict], reply_tokens: int, extra: dict,
        rec: RequestRecord) -> tuple[str, dict | None]:
    """One streamed completion, timed into `rec`; (the reply's text, the response's
    `truncation`, where the server gave one)."""
    parts: list[str] = []
    truncation = None
    rec.start = time.perf_counter()
    try:
        stream = api.chat.completions.create(
            model=model, messages=messages, max_tokens=reply_tokens, temperature=0.0,
            stream=True, stream_options={"include_usage": True}, extra_body=extra or None)
        for chunk in stream:
            now = time.perf_counter()
            truncation = (chunk.model_extra or {}).get("truncation", truncation)
            if chunk.usage is not None:
                rec.prompt_tokens = chunk.usage.prompt_tokens or 0
                rec.completion_tokens = chunk.usage.completion_tokens or 0
                details = chunk.usage.prompt_tokens_details
                rec.cached_tokens = (details.cached_tokens or 0) if details else 0
            for choice in chunk.choices or []:
                text = choice.delta.content if choice.delta else None
                if text:
                    rec.first_token = rec.first_token or now
                    rec.chunk_times.append(now)
                    parts.append(text)
        rec.end = time.perf_counter()
    except Exception as exc:  # a failed turn is counted; its conversation stops there
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
    return "".join(parts), truncation


def run_policy(name: str, server: Server, conversations: list[list[str]], reply_tokens: int,
               context: int, count) -> dict:
    from openai import OpenAI

    api = OpenAI(base_url=base_url(server.url), api_key=server.api_key or "none",
                 max_retries=0, timeout=900)
    model = api.models.list().data[0].id
    rows: list[dict] = []
    records: list[RequestRecord] = []
    for c, users in enumerate(conversations):
        messages = [{"role": "system", "content": SYSTEM}]
        previous = None
        left_out = 0
        for t, text in enumerate(users):
            messages.append({"role": "user", "content": text})
            sent = messages
            extra = {}
            if name == "ours":
                extra = {"truncation": "auto"}
            else:
                sent = trimmed(messages, context - reply_tokens - TRIM_MARGIN, count)
            rec = RequestRecord(conversation=c, turn=t + 1, start=0.0)
            reply, truncation = ask(api, model, sent, reply_tokens, extra, rec)
            records.append(rec)
            cacheable = None if previous is None else max(0, previous // BLOCK * BLOCK - BLOCK)
            cut = truncation is not None and truncation["turns_left_out"] != left_out
            if truncation is not None:
                left_out = truncation["turns_left_out"]
            rows.append({
                "conversation": c, "turn": t + 1, **rec.as_dict(),
                "messages_sent": len(sent), "cacheable_tokens": cacheable,
                "recompute": bool(cacheable) and rec.ok and rec.cached_tokens < MISS_BELOW * cacheable,
                "cut": cut, "turns_left_out": left_out if truncation is not None else None,
            })
            if not rec.ok:
                log(f"{name}: conversation {c} turn {t + 1} failed: {rec.error}")
                break
            if (t + 1) % 20 == 0:
                log(f"{name}: conversation {c}, {t + 1} turns")
            messages.append({"role": "assistant", "content": reply})
            previous = rec.prompt_tokens + rec.completion_tokens
    return summary(name, rows, records)


def summary(name: str, rows: list[dict], records: list[RequestRecord]) -> dict:
    ok = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    decode = [(r.completion_tokens - 1) / (r.end - r.first_token) for r in ok
              if r.completion_tokens > 1 and r.end > r.first_token]
    return {
        "run": name,
        "turns": len(rows),
        "answered": len(ok),
        "cached_share": (sum(r.cached_tokens for r in ok) / prompt) if prompt else None,
        "ttft_s": stats(r.ttft for r in ok),
        "output_tokens_per_s": stats(decode),
        "recomputes": sum(r["recompute"] for r in rows),
        "cuts": sum(r["cut"] for r in rows) if name == "ours" else None,
        "rows": rows,
    }


def start(name: str, args: argparse.Namespace, work: Path) -> Server:
    settings = ServerSettings(threads=args.threads, ctx=args.context, parallel=1)
    if name == "llamacpp":
        from inference.loader import smollm2_gguf_path

        return start_llama_server(args.llama_server, smollm2_gguf_path(), name, settings, work,
                                  extra_args=("--context-shift",))
    return start_ours("auto", name, settings, work, work / f"{name}.sqlite3",
                      extra_env={"LLM_MAX_MODEL_LEN": str(args.context)})


def run(args: argparse.Namespace) -> dict:
    tokenizer = load_client_tokenizer(DEFAULT_MODEL)
    count = wl.token_counter(tokenizer) or (lambda text: len(text.split()))
    conversations = [user_texts(args.seed, c, args.turns, count)
                     for c in range(args.num_conversations)]
    if args.llama_server is None:
        args.llama_server = lb.binary(lb.cache_dir(), "llama-server", isa=args.isa)
    names = [n for n in args.runs if n != "llamacpp" or args.llama_server.exists()]
    if "llamacpp" in args.runs and "llamacpp" not in names:
        log(f"no llama-server at {args.llama_server}: the llamacpp run is left out")
    work = Path(tempfile.mkdtemp(prefix="long-chat-"))
    results: dict[str, dict] = {}
    paths: dict[str, str | None] = {}
    result: dict = {}
    for name in names:
        server = start(name, args, work)
        paths[name] = server.cpu_path if name != "llamacpp" else args.isa
        try:
            log(f"{name}: serving on {server.url} ({paths[name]})")
            results[name] = run_policy(name, server, conversations, args.reply_tokens,
                                       args.context, count)
        finally:
            server.stop()
        result = {"context": args.context, "turns": args.turns,
                  "reply_tokens": args.reply_tokens,
                  "num_conversations": args.num_conversations, "threads": args.threads,
                  "served_model": SERVED_NAME, "llamacpp_isa": args.isa, "kernel_paths": paths,
                  "runs": results, "ratios": ratios(results)}
        write_json(args.out, result)  # after each run: a long one may be stopped
    print(table(result))
    return result


def ratios(results: dict[str, dict]) -> dict:
    """Ours' TTFT p90 over each other run's."""
    ours = results.get("ours", {}).get("ttft_s", {}).get("p90")
    out = {}
    for name, res in results.items():
        theirs = res["ttft_s"].get("p90")
        if name != "ours" and ours and theirs:
            out[f"ttft_p90_ours_over_{name}"] = ours / theirs
    return out


def table(result: dict) -> str:
    lines = [f"context {result['context']} tokens, {result['num_conversations']} x "
             f"{result['turns']} turns, replies of at most {result['reply_tokens']} tokens",
             f"{'run':<10} {'answered':>9} {'cached':>7} {'TTFT p50':>9} {'TTFT p90':>9} "
             f"{'tok/s':>6} {'recomputes':>10} {'cuts':>5}"]
    for name, r in result["runs"].items():
        ttft = r["ttft_s"]
        share = "-" if r["cached_share"] is None else f"{r['cached_share']:.1%}"
        p50 = "-" if ttft.get("p50") is None else f"{ttft['p50'] * 1000:.0f} ms"
        p90 = "-" if ttft.get("p90") is None else f"{ttft['p90'] * 1000:.0f} ms"
        tps = r["output_tokens_per_s"].get("mean")
        lines.append(f"{name:<10} {r['answered']:>4}/{r['turns']:<4} {share:>7} {p50:>9} "
                     f"{p90:>9} {'-' if tps is None else f'{tps:.1f}':>6} {r['recomputes']:>10} "
                     f"{'-' if r['cuts'] is None else r['cuts']:>5}")
    for key, value in result["ratios"].items():
        lines.append(f"{key}: {value:.2f}")
    return "\n".join(lines)


def run_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"runs are a comma-separated list of {', '.join(RUNS)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.parser("long-chat", __doc__)
    cli.add(p, "turns", 200)
    p.add_argument("--context", type=cli.positive_int, default=8192,
                   help="the context of every server, in tokens (default: %(default)s)")
    cli.add(p, "reply_tokens", 128)
    cli.add(p, "num_conversations", 1)
    p.add_argument("--runs", type=run_list, default=list(RUNS),
                   help=f"which runs, comma-separated, of {', '.join(RUNS)} (default: all)")
    p.add_argument("--isa", choices=lb.ISAS, default="native",
                   help="the llama.cpp build to run (default: %(default)s)")
    p.add_argument("--llama-server", type=Path, default=None,
                   help="the llama-server binary (default: the cached build of --isa)")
    cli.add(p, "server_threads")
    cli.add(p, "seed")
    cli.add(p, "out", DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    return run(parse_args(argv))
