"""Users with /v1 API keys in a live server's database, each its own tenant (its own
cache salt), made by tests/chatapp/api/seed.py in the server's environment."""

from __future__ import annotations

import itertools
import json
import subprocess

from tests.chatapp.e2e.conftest import PYTHON, ROOT, LiveServer

MODEL = "smollm2-135m-instruct"
_batches = itertools.count()


def tenants(server: LiveServer, prefix: str, n: int, **spec) -> list[str]:
    """n new users, each with one key (spec: rpm, concurrent, allow_cache_salt)."""
    out = subprocess.run(
        [PYTHON, str(ROOT / "tests/chatapp/api/seed.py"), f"{prefix}{next(_batches)}-",
         json.dumps([spec] * n)],
        env=server.env, cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return [a["key"] for a in json.loads(out.stdout.strip().splitlines()[-1])]


def metric(server: LiveServer, name: str, required: bool = True, **labels: str) -> float:
    """Sum of a metric's samples on /metrics whose labels include `labels`. A series
    that is absent (no engine loaded yet) fails when `required`, or else reads 0: a
    check that something is 0 must not pass on a missing figure."""
    import httpx2 as httpx

    want = [f'{k}="{v}"' for k, v in labels.items()]
    total, found = 0.0, False
    for line in httpx.get(server.url + "/metrics", timeout=30).text.splitlines():
        named = line.startswith((f"prefixchat:{name}{{", f"prefixchat:{name} "))
        if named and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found or not required, f"/metrics has no {name} {labels}"
    return total
