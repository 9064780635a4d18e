"""`python -m bench serve` against a live daphne of our app, serving the
2-layer random model of conftest.py (SmolLM2's tokenizer and chat template): two
conversations of two turns, a few tokens each. Behaviour only: the result has its
fields, and turn 2 is served partly from the prefix cache."""

from __future__ import annotations

import json
import subprocess

import pytest

import bench
from tests.chatapp.e2e.conftest import PYTHON, ROOT, start_live_server, stop_live_server


@pytest.fixture(scope="module")
def live_api(tmp_path_factory, tiny_model):
    server, proc = start_live_server(
        tmp_path_factory.mktemp("bench-live"),
        "bench",
        API_RATE_LIMIT_RPM="100000",
        API_MAX_CONCURRENT="8",
        LLM_PRELOAD="1",
        LLM_MODEL=str(tiny_model),
        LLM_DTYPE="float32",
    )
    yield server
    stop_live_server(proc)


def api_key(server) -> str:
    out = subprocess.run(
        [PYTHON, str(ROOT / "tests/chatapp/api/seed.py"), "bench-", "[{}]"],
        env=server.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])[0]["key"]


def test_serve_measures_our_server(live_api, tmp_path):
    out, png = tmp_path / "serve.json", tmp_path / "serve.png"
    result = bench.main(
        [
            "serve",
            "--url",
            live_api.url,
            "--api-key",
            api_key(live_api),
            "--workload",
            "multiturn",
            "--num-conversations",
            "2",
            "--turns",
            "2",
            "--system-tokens",
            "40",
            "--user-tokens",
            "8",
            "--reply-tokens",
            "4",
            "--out",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    if png.exists():
        assert png.read_bytes()[:4] == b"\x89PNG"

    assert result["warmup"]["ok"]
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (4, 0), s["errors"]
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(s[key]) == {"count", "mean", "p50", "p90", "p99"}
    assert s["ttft_s"]["count"] == 4 and s["ttft_s"]["p50"] > 0
    assert s["request_throughput"] > 0 and s["output_throughput"] > 0
    assert 0 < s["cached_share"] <= s["max_cached_share"] < 1

    turns = {t["turn"]: t for t in result["by_turn"]}
    assert set(turns) == {1, 2} and turns[2]["requests"] == 2
    assert turns[2]["cached_share"] > 0
    for r in result["requests"]:
        assert r["ok"] and r["prompt_tokens"] > 0 and 0 < r["completion_tokens"] <= 4
        assert r["ttft"] <= r["e2e"]
        assert r["cached_tokens"] <= r["max_cached_tokens"]
        if r["turn"] == 2:
            assert r["cached_tokens"] > 0
