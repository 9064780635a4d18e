"""Acceptance 1 and 2: after a scripted chat workload through the real chat services and
the real engine, the dashboard and /metrics show exactly the engine's own counters, and
the per-preset rows add up the stored replies."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from django.contrib.admin.models import LogEntry
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from chatapp.chat import services as chat_services
from chatapp.chat.models import Message
from chatapp.generation.embedded import get_engine
from chatapp.generation.replies import run_reply
from chatapp.prompts.services import PromptBuilder

pytestmark = [pytest.mark.model, pytest.mark.django_db]

COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "blocks_total", "blocks_used",
            "blocks_cached_free", "blocks_free", "evictions", "preemptions", "num_running",
            "num_waiting", "prompt_tokens_total", "generation_tokens_total",
            "requests_finished", "requests_failed", "requests_aborted")
QUESTIONS = ["Name a colour.", "Name another one.", "And one more?"]


@pytest.fixture(scope="module")
def workload(django_db_setup, django_db_blocker):
    """Two conversations on one preset (three turns each), one on another (two turns)."""
    with django_db_blocker.unblock(), override_settings(
        CHAT_MAX_NEW_TOKENS=6, CHAT_TEMPERATURE=0.0, DASHBOARD_SAMPLE_INTERVAL_S=0
    ):
        from django.contrib.auth import get_user_model

        engine = get_engine()
        before = engine.metrics()
        owner = get_user_model().objects.create_user("dash-workload")
        general = [chat_services.conversation_create(owner=owner, preset_id="general")
                   for _ in range(2)]
        coding = chat_services.conversation_create(owner=owner, preset_id="coding")
        script = [(c, q) for q in QUESTIONS for c in general] + [(coding, q) for q in QUESTIONS[:2]]
        for conv, question in script:
            conv.refresh_from_db()
            _, reply = chat_services.message_send(conversation=conv, content=question)
            final = async_to_sync(run_reply)(reply.pk)
            assert final["status"] == "done", final
        after = engine.metrics()
        yield {"engine": engine, "before": before, "after": after, "general": general,
               "coding": coding, "owner": owner}
        owner.delete()


def replies_of(*convs):
    return list(Message.objects.filter(conversation__in=convs, role="assistant").order_by("id"))


def test_dashboard_figures_equal_the_engine_counters(workload, staff_client):
    engine = workload["engine"]
    data = staff_client.get("/admin/cache/data/").json()
    now = engine.metrics()  # the engine is idle: nothing moves between the two reads
    assert now["num_running"] == 0 and now["num_waiting"] == 0
    (web,) = [e for e in data["figures"]["engines"] if e["engine_id"] == now["engine_id"]]
    assert web["live"] is True
    for key in COUNTERS:
        assert web[key] == now[key], key
        assert data["figures"]["total"][key] == now[key], key
    assert web["hit_rate"] == pytest.approx(now["prefix_cache_hits"] / now["prefix_cache_queries"])
    last = now["recent_requests"][-data["figures"]["recent_n"]:]
    assert web["recent"]["cached_tokens"] == sum(r["cached_tokens"] for r in last)
    assert web["recent"]["prompt_tokens"] == sum(r["prompt_tokens"] for r in last)
    hits = [r["ttft"] for r in last if r["cached_tokens"] > 0]
    assert web["ttft"]["hit"]["requests"] == len(hits)
    assert web["ttft"]["hit"]["p50"] == sorted(hits)[(len(hits) + 1) // 2 - 1]

    page = staff_client.get("/admin/cache/").content.decode()
    assert f'id="total-queries" data-value="{now["prefix_cache_queries"]}"' in page
    assert f'id="total-hits" data-value="{now["prefix_cache_hits"]}"' in page


def test_the_workload_tokens_are_what_the_engine_counted(workload):
    """The stored usage of every reply adds up to the engine's counter changes."""
    before, after = workload["before"], workload["after"]
    replies = replies_of(*workload["general"], workload["coding"])
    assert len(replies) == 8
    assert after["preemptions"] == before["preemptions"]  # else queries count a prompt twice
    assert after["prefix_cache_queries"] - before["prefix_cache_queries"] == sum(
        r.prompt_tokens for r in replies)
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] == sum(
        r.cached_tokens for r in replies)


def test_per_preset_rows(workload, staff_client):
    engine = workload["engine"]
    rows = {r["preset_id"]: r for r in staff_client.get("/admin/cache/data/").json()["presets"]}
    builder = PromptBuilder(engine.tokenizer, block_size=16)
    for conv, requests, conversations in ((workload["general"][0], 6, 2),
                                          (workload["coding"], 2, 1)):
        row = rows[conv.preset_id]
        convs = workload["general"] if conv.preset_id == "general" else [conv]
        replies = replies_of(*convs)
        assert row["preset_version"] == conv.preset_version
        assert (row["requests"], row["conversations"]) == (requests, conversations)
        assert row["prompt_tokens"] == sum(r.prompt_tokens for r in replies)
        assert row["cached_tokens"] == sum(r.cached_tokens for r in replies)
        assert row["hit_rate"] == pytest.approx(row["cached_tokens"] / row["prompt_tokens"])
        shared = len(builder.system_segment(conv.preset_id, conv.preset_version))
        assert row["shared_prefix_len"] == shared and shared % 16 == 0
    # The second conversation on a preset starts on the first one's system blocks.
    first_b = replies_of(workload["general"][1])[0]
    assert first_b.cached_tokens >= rows["general"]["shared_prefix_len"]


def test_recent_requests_say_where_each_match_ended(workload, staff_client):
    rows = staff_client.get("/admin/cache/data/").json()["recent_requests"]
    replies = replies_of(*workload["general"], workload["coding"])
    by_id = {r["request_id"]: r for r in rows}
    for reply in replies:
        row = by_id[reply.request_id]
        assert (row["prompt_tokens"], row["cached_tokens"]) == (reply.prompt_tokens,
                                                                 reply.cached_tokens)
        assert row["match_end_block"] == reply.cached_tokens // 16
        assert row["preset"] == f"{reply.conversation.preset_id}@{reply.conversation.preset_version}"
    # Later turns reuse everything the previous turn computed.
    later = [r for r in replies if r.parent.parent_id is not None]
    assert later and all(by_id[r.request_id]["cause"].startswith("full") for r in later)


def test_metrics_endpoint_has_the_cache_counters(workload, client, settings):
    now = workload["engine"].metrics()
    text = client.get("/metrics").content.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(family: str, sample: str, **labels) -> float:
        (s,) = [s for s in families[family].samples if s.name == sample and s.labels == {
            "engine": now["engine_id"], "model": settings.LLM_MODEL, **labels}]
        return s.value

    p = "prefixchat:"
    assert value(p + "prefix_cache_queries", p + "prefix_cache_queries_total") == now[
        "prefix_cache_queries"]
    assert value(p + "prefix_cache_hits", p + "prefix_cache_hits_total") == now["prefix_cache_hits"]
    assert value(p + "num_preemptions", p + "num_preemptions_total") == now["preemptions"]
    assert value(p + "kv_cache_usage_perc", p + "kv_cache_usage_perc") == pytest.approx(
        now["kv_cache_usage"])
    assert value(p + "num_requests_running", p + "num_requests_running") == now["num_running"]
    assert value(p + "num_requests_waiting", p + "num_requests_waiting") == now["num_waiting"]
    assert value(p + "prompt_tokens", p + "prompt_tokens_total") == now["prompt_tokens_total"]
    assert value(p + "generation_tokens", p + "generation_tokens_total") == now[
        "generation_tokens_total"]
    for name, key in (("time_to_first_token_seconds", "ttft_seconds"),
                      ("inter_token_latency_seconds", "inter_token_latency_seconds"),
                      ("e2e_request_latency_seconds", "e2e_request_latency_seconds")):
        assert value(p + name, p + name + "_count") == now[key]["count"]
        assert value(p + name, p + name + "_bucket", le="+Inf") == now[key]["count"]
    assert p + "http_requests" in families  # the web service's own request metrics


def test_the_kernel_path_is_on_readyz_metrics_and_the_dashboard(workload, client, staff_client):
    """The path this process took (kernels.cpu_features), with the engine's dtypes."""
    from kernels.cpu_features import cpu_path

    engine = workload["engine"]
    engine_id = engine.metrics()["engine_id"]
    # On a GPU the path is the device type, not a CPU path.
    device = engine.config.device.split(":")[0]
    path = cpu_path() if device == "cpu" else device
    want = {"cpu_path": path, "dtype": engine.config.dtype,
            "weight_dtype": engine.config.weight_dtype, "kv_dtype": engine.config.kv_dtype}
    # resolved when the engine was built
    assert want["weight_dtype"] != "auto" and want["kv_dtype"] != "auto"

    model = client.get("/readyz").json()["checks"]["model"]
    assert {key: model[key] for key in want} == want

    text = client.get("/metrics").content.decode()
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "prefixchat:engine_info"]
    (sample,) = [s for s in family.samples if s.labels["engine"] == engine_id]
    assert {key: sample.labels[key] for key in want} == want and sample.value == 1

    data = staff_client.get("/admin/cache/data/").json()
    (web,) = [e for e in data["figures"]["engines"] if e["engine_id"] == engine_id]
    assert {key: web[key] for key in want} == want
    assert f'data-value="{path}">{path}</span>' in data["html"]


def test_profile_of_recent_prompts_is_on_the_page(workload, staff_client):
    page = staff_client.get("/admin/cache/").content.decode()
    assert "Token profile of recent prompts" in page
    assert "share" in page and 'class="profile"' in page


def test_reset_asks_first_then_resets_and_is_logged(workload, staff_client):
    engine = workload["engine"]
    engine_id = engine.metrics()["engine_id"]
    confirm = staff_client.get(f"/admin/cache/reset/{engine_id}/")
    assert confirm.status_code == 200 and b'id="reset-form"' in confirm.content
    assert not LogEntry.objects.exists()  # asking resets nothing
    done = staff_client.post(f"/admin/cache/reset/{engine_id}/")
    assert done.status_code == 302 and done["Location"] == "/admin/cache/"
    entry = LogEntry.objects.get()
    assert entry.change_message == "Prefix cache reset done." and entry.object_repr == engine_id
    # The engine applies the reset between steps; bounded wait, no timing asserted.
    for _ in range(200):
        if engine.metrics()["blocks_cached_free"] == 0:
            break
        time.sleep(0.05)
    assert engine.metrics()["blocks_cached_free"] == 0
