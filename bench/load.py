"""Thirty chat pages at once, round after round: does every reply reach its page?

    python -m bench load [--rounds 10] [--clients 30] [--timeout-s 300]
        [--out bench-results/load.json]

Our server (daphne, as `make run` serves; on Redis's channel layer when REDIS_URL is
set, as in CI) gets CLIENTS users, each with a conversation of its own per round. Each
round, every client opens its conversation's WebSocket at once, sends one message and
waits for its reply's message.done. A reply whose done does not come within TIMEOUT_S
is a hang; one that gets two is a duplicate. A round also checks each stream: deltas
numbered 1, 2, 3... whose text is the stored reply's. Printed per round and in all, and
written as JSON; the exit status is 1 when any reply hung, came twice or came wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import cli
from bench.report import progress_log, write_json
from bench.servers import ROOT, ServerSettings, start_ours

log = progress_log("bench load")

# Run in the server's environment: CLIENTS users, each with a ready session (no
# password hash), and ROUNDS conversations each.
SEED = """
import json, sys
import django
django.setup()
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from chatapp.chat import services
clients, rounds = int(sys.argv[1]), int(sys.argv[2])
out = []
for i in range(clients):
    user = get_user_model()(username=f"load{i}")
    user.set_unusable_password()
    user.save()
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    out.append({"sessionid": session.session_key, "conversations": [
        services.conversation_create(owner=user).pk for _ in range(rounds)]})
print(json.dumps(out))
"""


def seed(env: dict, clients: int, rounds: int) -> list[dict]:
    out = subprocess.run([sys.executable, "-c", SEED, str(clients), str(rounds)], env=env,
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_stream(events: list[dict], reply_id: int | None) -> str:
    """What is wrong with one reply's events ("" when nothing)."""
    if reply_id is None:
        return "no reply was created"
    dones = [e for e in events if e["type"] == "message.done" and e["message_id"] == reply_id]
    if not dones:
        return "hang"
    if len(dones) > 1:
        return "duplicate done"
    deltas = [e for e in events if e["type"] == "message.delta" and e["message_id"] == reply_id]
    seqs = [d["seq"] for d in deltas]
    if seqs != list(range(1, len(deltas) + 1)):
        return f"deltas out of sequence: {seqs} then done {dones[0]['seq']}"
    final = dones[0]["message"]
    streamed = "".join(d["text"] for d in deltas)
    if streamed != final["content"]:
        return f"deltas differ from the stored text: {streamed!r} / {final['content']!r}"
    if final["status"] != "done":
        return f"ended {final['status']}"
    return ""


async def one_client(ws_url: str, origin: str, sessionid: str, conversation: int, index: int,
                     timeout_s: float) -> dict:
    from websockets.asyncio.client import connect

    events: list[dict] = []
    reply_id = None
    started = time.perf_counter()
    headers = {"Cookie": f"sessionid={sessionid}"}
    async with connect(f"{ws_url}/ws/chat/{conversation}/", additional_headers=headers,
                       origin=origin, open_timeout=timeout_s) as ws:
        await asyncio.wait_for(ws.recv(), timeout_s)  # hello
        await ws.send(json.dumps({"type": "send", "content": f"Say the number {index}."}))
        deadline = time.perf_counter() + timeout_s
        try:
            while True:
                left = deadline - time.perf_counter()
                event = json.loads(await asyncio.wait_for(ws.recv(), max(left, 0.001)))
                events.append(event)
                if (event["type"] == "message.created"
                        and event["message"]["role"] == "assistant"):
                    reply_id = event["message"]["id"]
                if event["type"] == "message.done" and event["message_id"] == reply_id:
                    # A second done would come right behind the first: wait a moment.
                    with_more = await _more(ws, 0.5)
                    events += with_more
                    break
        except TimeoutError:
            pass
    return {"conversation": conversation, "problem": check_stream(events, reply_id),
            "seconds": time.perf_counter() - started}


async def _more(ws, wait_s: float) -> list[dict]:
    more = []
    try:
        while True:
            more.append(json.loads(await asyncio.wait_for(ws.recv(), wait_s)))
    except TimeoutError:
        return more


async def one_round(url: str, clients: list[dict], round_index: int,
                    timeout_s: float) -> list[dict]:
    ws_url = url.replace("http://", "ws://")
    return list(await asyncio.gather(*(
        one_client(ws_url, url, c["sessionid"], c["conversations"][round_index], i, timeout_s)
        for i, c in enumerate(clients))))


def main(argv: list[str] | None = None) -> dict:
    p = cli.parser("load", __doc__)
    cli.add(p, "rounds", 10)
    p.add_argument("--clients", type=cli.positive_int, default=30,
                   help="pages at once (default: %(default)s)")
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="how long a page waits for its reply's done before it counts as "
                        "a hang (default: %(default)s)")
    cli.add(p, "out", cli.RESULTS / "load.json")
    cli.add(p, "logs", cli.RESULTS / "logs")
    args: argparse.Namespace = p.parse_args(argv)

    args.logs.mkdir(parents=True, exist_ok=True)
    # The seeding process signs its sessions with the server's key.
    extra = {"CHAT_TEMPERATURE": "0", "CHAT_MAX_NEW_TOKENS": "512", "OMP_NUM_THREADS": "1",
             "DJANGO_SECRET_KEY": secrets.token_urlsafe(32)}
    if os.environ.get("REDIS_URL"):
        extra["REDIS_URL"] = os.environ["REDIS_URL"]
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        server = start_ours("auto", "load", ServerSettings(), args.logs,
                            Path(tmp) / "db.sqlite3", extra_env=extra)
        try:
            env = {**os.environ, **extra, "DJANGO_SETTINGS_MODULE": "chatapp.settings",
                   "DATABASE_URL": f"sqlite:///{Path(tmp) / 'db.sqlite3'}"}
            clients = seed(env, args.clients, args.rounds)
            for r in range(args.rounds):
                started = time.perf_counter()
                results = asyncio.run(one_round(server.url, clients, r, args.timeout_s))
                wall = time.perf_counter() - started
                problems = [x for x in results if x["problem"]]
                rounds.append({
                    "round": r + 1, "clients": len(results), "wall_s": round(wall, 2),
                    "done": len(results) - len(problems),
                    "hangs": sum(x["problem"] == "hang" for x in problems),
                    "problems": [{"conversation": x["conversation"], "problem": x["problem"]}
                                 for x in problems],
                    "slowest_s": round(max(x["seconds"] for x in results), 2),
                })
                last = rounds[-1]
                log(f"round {r + 1}/{args.rounds}: {last['done']}/{last['clients']} done, "
                    f"{last['hangs']} hung, {len(problems) - last['hangs']} other problems, "
                    f"{wall:.1f}s (slowest reply {last['slowest_s']}s)")
        finally:
            server.stop()
    total = sum(r["clients"] for r in rounds)
    done = sum(r["done"] for r in rounds)
    hangs = sum(r["hangs"] for r in rounds)
    result = {"bench": "load", "rounds": rounds, "clients": args.clients,
              "timeout_s": args.timeout_s, "cpu_path": server.cpu_path,
              "channel_layer": "redis" if "REDIS_URL" in extra else "in-memory",
              "replies": total, "done": done, "hangs": hangs,
              "problems": total - done}
    print(f"{done}/{total} replies got exactly one message.done with their whole text; "
          f"{hangs} hung, {total - done - hangs} other problems "
          f"({args.rounds} rounds x {args.clients} clients, {result['channel_layer']} "
          f"channel layer, {server.cpu_path})")
    write_json(args.out, result, log)
    if total != done:
        sys.exit(1)
    return result
