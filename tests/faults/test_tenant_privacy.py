"""A tenant learns nothing about another tenant's cache, on a live server.

Tenant A sends a long prompt P; tenant B then sends P and a prompt Q of the same token
length that nobody sent. B's receipts for the two are equal, and so are their costs: a
block cached under A's salt is, for B, a block never computed. As a control that the
timing can see a cache hit at all, A's own re-send of P is clearly faster than cold.
"""

from __future__ import annotations

import random
import statistics
import time

import httpx2 as httpx
import pytest

from tests.faults.apikeys import MODEL, metric, tenants

pytestmark = pytest.mark.model

ROUNDS = 7
WORDS = 420  # ~ one token each: a prompt of about 430 tokens, 26 whole blocks
VOCAB = ("apple river stone cloud garden window silver market forest candle engine "
         "pencil harbor meadow lantern basket valley mirror thunder violet copper "
         "ladder blanket compass feather island jacket kettle marble needle orange "
         "pepper rocket saddle tunnel velvet wagon yellow zebra anchor bridge castle "
         "dragon falcon glacier hammer igloo jungle kingdom lemon magnet nectar "
         "oyster puzzle quartz ribbon shadow tiger umbrella vessel walnut")


def prompt_pair(rng: random.Random) -> tuple[str, str]:
    """P and Q: the same words (so the same number of tokens: each word is its own
    pre-token) in two orders, sharing only the first word, so no whole block."""
    words = [rng.choice(VOCAB.split()) for _ in range(WORDS)]
    head, rest = words[0], words[1:]
    shuffled = rest[:]
    rng.shuffle(shuffled)
    return " ".join([head, *rest]), " ".join([head, *shuffled])


def ask(client: httpx.Client, url: str, key: str, text: str) -> tuple[float, dict]:
    """(seconds for the whole answer, usage) of a one-token completion."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1,
            "temperature": 0, "prefix_cache_receipt": True}
    start = time.perf_counter()
    response = client.post(url, json=body, headers={"Authorization": f"Bearer {key}"})
    elapsed = time.perf_counter() - start
    assert response.status_code == 200, response.text
    return elapsed, response.json()["usage"]


def test_another_tenant_s_prompt_reads_and_times_as_one_never_sent(fault_server):
    key_a, key_b = tenants(fault_server, "privacy", 2)
    url = fault_server.url + "/v1/chat/completions"
    rng = random.Random(26)
    times: dict[str, list[float]] = {"b_p": [], "b_q": [], "a_cold": [], "a_own": []}
    with httpx.Client(timeout=120) as client:
        # Warm-up (the model loads on first use; the first requests pay for page-ins).
        for key in (key_a, key_b):
            ask(client, url, key, " ".join(prompt_pair(rng)))
        for i in range(ROUNDS):
            p, q = prompt_pair(rng)  # new each round: B never re-sends its own
            t, a_usage = ask(client, url, key_a, p)
            times["a_cold"].append(t)
            assert a_usage["prompt_tokens_details"]["cached_tokens"] == 0
            # Interleaved, the order alternating, so neither pays for going first.
            order = (("b_p", p), ("b_q", q)) if i % 2 == 0 else (("b_q", q), ("b_p", p))
            usage = {}
            for name, text in order:
                t, usage[name] = ask(client, url, key_b, text)
                times[name].append(t)
            t, own = ask(client, url, key_a, p)
            times["a_own"].append(t)

            b_p, b_q = usage["b_p"], usage["b_q"]
            assert b_p["prompt_tokens"] == b_q["prompt_tokens"] == a_usage["prompt_tokens"] > 400
            # Equal receipts: nothing of A's copy shows through.
            assert b_p["prefix_cache"] == b_q["prefix_cache"]
            assert (b_p["prefix_cache"]["reason"], b_p["prefix_cache"]["matched_tokens"]) == (
                "cold", 0)
            assert b_p["prompt_tokens_details"]["cached_tokens"] == 0
            assert b_q["prompt_tokens_details"]["cached_tokens"] == 0
            # The control: A's own copy hits (all but the last block).
            assert own["prompt_tokens_details"]["cached_tokens"] >= own["prompt_tokens"] - 16
            assert own["prefix_cache"]["reason"] == "full"

    # Only the operator's aggregate counts misses on another tenant's tokens (B's P).
    assert metric(fault_server, "prefix_cache_match_end_total", reason="salt") >= ROUNDS

    med = {name: statistics.median(ts) for name, ts in times.items()}
    print("median seconds:", {k: round(v, 4) for k, v in med.items()},
          "B P/Q ratio:", round(med["b_p"] / med["b_q"], 3),
          "A cold/own ratio:", round(med["a_cold"] / med["a_own"], 2))
    # No timing difference beyond noise between A's prompt and a never-sent one...
    assert 0.67 <= med["b_p"] / med["b_q"] <= 1.5, med
    # ...while a real hit is plainly visible: the measure is sensitive.
    assert med["a_own"] * 2 < med["a_cold"], med
    assert med["a_own"] * 2 < med["b_p"], med
