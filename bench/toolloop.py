"""An agent's tool loop against our server: each turn the model must call a tool
(`tool_choice: "required"`, so its arguments are generated under the function's schema),
the client sends the call back re-serialised (keys sorted, no spaces: what many agent
frameworks do) with the tool's result, and asks again.

    python -m bench toolloop [--turns 8] [--loops 3] [--url URL --api-key KEY]
                             [--no-mask-cost] [--out bench-results/toolloop.json]

Without --url it starts our server as `make run` would (its own SQLite file). Per turn it
reports the prompt, the cached tokens and the share of the cacheable prefix (the previous
turn's prompt and completion, in whole 16-token blocks, less one block) that the cache
served, and the completion's time per output token. A server that re-rendered the
re-serialised arguments would miss from the first call on; ours splices back the ids
it generated (docs/api.md, "Tools"). Then, in this process, the grammar mask's cost per
decode token at batch 1 and 16 on the default model (`python -m bench grammar`, one
round), since each of these calls was generated under one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench import cli
from bench.report import write_json
from bench.servers import ServerSettings, start_ours

DEFAULT_OUT = cli.RESULTS / "toolloop.json"
BLOCK = 16
CITIES = ["Paris", "London", "Tokyo", "Lima", "Oslo", "Cairo", "Delhi", "Quito"]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": CITIES},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": CITIES}},
            "required": ["city"], "additionalProperties": False}}},
]


def one_loop(client, model: str, turns: int, loop: int) -> list[dict]:
    """One agent loop; a row per turn."""
    messages = [{"role": "system", "content": "You are a travel assistant. Use the tools."},
                {"role": "user", "content": f"Plan a day in {CITIES[loop % len(CITIES)]}: "
                                            "check the weather and the time first."}]
    rows, previous = [], None
    for turn in range(turns):
        started = time.perf_counter()
        done = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                              tool_choice="required", temperature=0,
                                              max_tokens=64)
        elapsed = time.perf_counter() - started
        usage = done.usage
        [call] = done.choices[0].message.tool_calls[:1]
        cacheable = 0 if previous is None else max(0, previous // BLOCK * BLOCK - BLOCK)
        cached = usage.prompt_tokens_details.cached_tokens or 0
        rows.append({
            "loop": loop, "turn": turn + 1, "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens, "cached_tokens": cached,
            "cacheable_tokens": cacheable,
            "cached_share_of_cacheable": None if not cacheable else min(1.0, cached / cacheable),
            "seconds": elapsed, "call": call.function.name,
        })
        previous = usage.prompt_tokens + usage.completion_tokens
        arguments = json.dumps(json.loads(call.function.arguments), separators=(",", ":"),
                               sort_keys=True)
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call.id,
             "content": json.dumps({"ok": True, "turn": turn + 1})},
            {"role": "user", "content": "Good. Check something else."},
        ]
    return rows


def summarise(rows: list[dict]) -> dict:
    by_turn = {}
    for turn in sorted({r["turn"] for r in rows}):
        these = [r for r in rows if r["turn"] == turn]
        shares = [r["cached_share_of_cacheable"] for r in these
                  if r["cached_share_of_cacheable"] is not None]
        by_turn[turn] = {
            "prompt_tokens": statistics.median(r["prompt_tokens"] for r in these),
            "cached_tokens": statistics.median(r["cached_tokens"] for r in these),
            "cached_share_of_cacheable": min(shares) if shares else None,
            "seconds": statistics.median(r["seconds"] for r in these),
        }
    return by_turn


def run(args: argparse.Namespace) -> dict:
    from openai import OpenAI

    server = None
    url, key = args.url, args.api_key
    if url is None:
        work = Path(tempfile.mkdtemp(prefix="toolloop-"))
        server = start_ours("auto", "toolloop", ServerSettings(threads=args.threads),
                            work, work / "db.sqlite3")
        url, key = server.url, server.api_key
    try:
        client = OpenAI(base_url=url.rstrip("/") + "/v1", api_key=key or "none", timeout=600)
        model = client.models.list().data[0].id
        rows = [r for loop in range(args.loops) for r in one_loop(client, model, args.turns, loop)]
    finally:
        if server is not None:
            server.stop()
    result = {"turns": args.turns, "loops": args.loops, "rows": rows, "by_turn": summarise(rows)}
    if args.mask_cost:
        import bench

        result["grammar_mask"] = bench.main([
            "grammar", "--batches", "1", "16", "--rounds", "1",
            "--out", str(args.out.with_name(args.out.stem + "-grammar.json"))])["batches"]
    print(f"{'turn':>4} {'prompt':>7} {'cached':>7} {'share of cacheable':>19} {'s':>6}")
    for turn, row in result["by_turn"].items():
        share = row["cached_share_of_cacheable"]
        print(f"{turn:>4} {row['prompt_tokens']:>7.0f} {row['cached_tokens']:>7.0f} "
              f"{'-' if share is None else f'{share:.1%}':>19} {row['seconds']:>6.2f}")
    write_json(args.out, result)
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.parser("toolloop", __doc__)
    cli.add(p, "turns", 8)
    p.add_argument("--loops", type=cli.positive_int, default=3,
                   help="agent loops, each on its own city (default: %(default)s)")
    cli.add(p, "url", default_text="start ours")
    cli.add(p, "api_key", default_text="the started server's")
    cli.add(p, "server_threads")
    p.add_argument("--no-mask-cost", dest="mask_cost", action="store_false",
                   help="skip measuring the grammar mask's cost per token")
    cli.add(p, "out", DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    return run(parse_args(argv))
