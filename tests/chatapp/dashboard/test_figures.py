"""Figures, history and charts without a model: engines that report through the database."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from chatapp.dashboard import history, sampling, selectors, stats
from chatapp.dashboard.models import EngineSample, EngineStatus

from .conftest import fake_snapshot

# The labels of fake_snapshot()'s engines in /metrics.
WORKER_1 = (("engine", "worker-1"), ("model", "fake-model"))
WORKER_2 = (("engine", "worker-2"), ("model", "fake-model"))


@pytest.fixture(autouse=True)
def no_local_engine(monkeypatch):
    from chatapp.generation import embedded as host

    monkeypatch.setattr(host, "_engines", {})


def test_quantiles():
    assert stats.quantile([], 0.5) is None
    assert stats.quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert stats.quantile([1.0, 2.0, 3.0, 4.0], 0.95) == 4.0
    # 4 observations: 1 below 0.1, 3 in (0.1, 1.0]
    assert stats.histogram_quantile([0.1, 1.0], [1, 4, 4], 0.25) == pytest.approx(0.1)
    assert stats.histogram_quantile([0.1, 1.0], [1, 4, 4], 1.0) == pytest.approx(1.0)
    assert stats.histogram_quantile([0.1, 1.0], [0, 0, 0], 0.5) is None
    assert stats.histogram_quantile([0.1, 1.0], [0, 0, 2], 0.5) == 1.0  # only +Inf


def test_why_a_match_ended_is_the_receipt_in_words():
    text = selectors.receipt_text
    assert text(None) == "no receipt"
    assert text({"reason": "full", "matched_tokens": 160, "tier_tokens": 0}) == "full"
    # The engine's own record calls new tokens after a reused prefix cold: that is full.
    assert text({"reason": "cold", "matched_tokens": 64, "tier_tokens": 0}) == "full"
    assert text({"reason": "cold", "matched_tokens": 0, "tier_tokens": 0}) == "cold"
    assert text({"reason": "evicted", "evicted_from": "tier", "matched_tokens": 32,
                 "tier_tokens": 16}) == "evicted from tier, 16 restored"
    assert text({"reason": "diverged", "diverged_at": 70, "diverged_message_id": 9,
                 "diverged_segment": "new message", "matched_tokens": 64,
                 "tier_tokens": 0}) == "diverged at token 70 (new message #9)"


@pytest.mark.django_db
def test_several_engines_are_shown_each_and_totalled():
    sampling.snapshot_record(snapshot=fake_snapshot("worker-1"))
    sampling.snapshot_record(snapshot=fake_snapshot(
        "worker-2", prefix_cache_queries=500, prefix_cache_hits=100, blocks_used=20))
    figures = selectors.dashboard_figures()
    assert [e["engine_id"] for e in figures["engines"]] == ["worker-1", "worker-2"]
    total = figures["total"]
    assert total["prefix_cache_queries"] == 1500 and total["prefix_cache_hits"] == 700
    assert total["hit_rate"] == pytest.approx(700 / 1500)  # token-weighted, not a mean of rates
    assert total["blocks_used"] == 30 and total["blocks_total"] == 200
    assert total["recent"]["requests"] == 4
    assert total["ttft"]["hit"] == {"requests": 2, "p50": 0.05, "p95": 0.05}
    assert total["ttft"]["miss"]["p95"] == 0.5


@pytest.mark.django_db
def test_figures_per_model_add_up_to_the_total(client, staff_client):
    """Several models (LLM_MODELS): each model's engines, in every process, are summed
    under its alias, on the page and in /metrics, and the models add up to the total."""
    sampling.snapshot_record(snapshot=fake_snapshot("web:small", model="small"))
    sampling.snapshot_record(snapshot=fake_snapshot("w1:small", model="small",
                                                    prefix_cache_hits=100, num_running=3))
    sampling.snapshot_record(snapshot=fake_snapshot("web:tiny", model="tiny",
                                                    prefix_cache_queries=400, evictions=9))
    figures = selectors.dashboard_figures()
    models = {m["model"]: m for m in figures["models"]}
    assert (models["small"]["engines"], models["tiny"]["engines"]) == (2, 1)
    assert models["small"]["prefix_cache_hits"] == 700
    assert models["tiny"]["prefix_cache_queries"] == 400
    for key in stats.SUMMED:
        assert sum(m[key] for m in models.values()) == figures["total"][key], key
    assert models["small"]["hit_rate"] == pytest.approx(700 / 2000)

    page = staff_client.get("/admin/cache/").content.decode()
    assert 'id="model-small" data-model="small"' in page and 'id="model-tiny"' in page

    text = client.get("/metrics").content.decode()
    by_model: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "prefixchat:prefix_cache_hits_total":
                by_model[sample.labels["model"]] = (by_model.get(sample.labels["model"], 0)
                                                    + sample.value)
    assert by_model == {"small": 700, "tiny": 600}


@pytest.mark.django_db
def test_a_stale_engine_is_shown_but_not_totalled_nor_exported(client, settings):
    settings.DASHBOARD_ENGINE_STALE_S = 60
    sampling.snapshot_record(snapshot=fake_snapshot("worker-1"))
    sampling.snapshot_record(snapshot=fake_snapshot("old"),
                             now=timezone.now() - timedelta(minutes=5))
    figures = selectors.dashboard_figures()
    assert {e["engine_id"]: e["stale"] for e in figures["engines"]} == {"old": True,
                                                                        "worker-1": False}
    assert figures["total"]["prefix_cache_queries"] == 1000
    text = client.get("/metrics").content.decode()
    engines = {s.labels.get("engine") for f in text_string_to_metric_families(text)
               for s in f.samples if f.name.startswith("prefixchat:prefix_cache")}
    assert engines == {"worker-1"}


@pytest.mark.django_db
def test_history_series_are_interval_rates_summed_over_engines():
    now = timezone.now()
    t0 = now - timedelta(minutes=10)
    for engine_id, scale in (("a", 1), ("b", 3)):
        for i, (queries, hits) in enumerate([(0, 0), (100, 50), (300, 250)]):
            sampling.snapshot_record(
                snapshot=fake_snapshot(engine_id, prefix_cache_queries=queries * scale,
                                       prefix_cache_hits=hits * scale),
                now=t0 + timedelta(minutes=2 * i))
    points = history.series(range_name="hour", now=now)
    rates = [r for r in points["hit_rate"] if r is not None]
    assert rates == [pytest.approx(0.5), pytest.approx(1.0)]
    assert [u for u in points["kv_usage"] if u is not None] == [pytest.approx(0.1)] * 3


@pytest.mark.django_db
def test_a_restarted_engine_does_not_give_negative_rates():
    now = timezone.now()
    for i, (queries, hits) in enumerate([(1000, 900), (100, 20)]):
        sampling.snapshot_record(snapshot=fake_snapshot(prefix_cache_queries=queries,
                                                        prefix_cache_hits=hits),
                                 now=now - timedelta(minutes=5 - 2 * i))
    rates = [r for r in history.series(now=now)["hit_rate"] if r is not None]
    assert rates == [pytest.approx(0.2)]


@pytest.mark.django_db
def test_charts_are_svg_with_points(staff_client):
    now = timezone.now()
    for i in range(3):
        sampling.snapshot_record(snapshot=fake_snapshot(prefix_cache_queries=100 * i,
                                                        prefix_cache_hits=50 * i),
                                 now=now - timedelta(seconds=150 - 60 * i))
    page = staff_client.get("/admin/cache/").content.decode()
    for chart in ("chart-hit-rate", "chart-blocks", "chart-ttft"):
        assert f'id="{chart}"' in page
    assert "<polyline" in page and "<script src=\"http" not in page
    day = staff_client.get("/admin/cache/?range=day").content.decode()
    assert 'class="point"' in day and "History (last day)" in day


@pytest.mark.django_db
def test_old_samples_are_pruned(settings):
    settings.DASHBOARD_RETENTION_HOURS = 1
    now = timezone.now()
    sampling.snapshot_record(snapshot=fake_snapshot(), now=now - timedelta(hours=2))
    sampling.snapshot_record(snapshot=fake_snapshot(), now=now)
    assert sampling.samples_prune(now=now) == 1
    assert EngineSample.objects.count() == 1


@pytest.mark.django_db
def test_a_reset_for_another_process_waits_for_that_engine(staff_client):
    sampling.snapshot_record(snapshot=fake_snapshot("worker-1"))
    response = staff_client.post("/admin/cache/reset/worker-1/")
    assert response.status_code == 302
    status = EngineStatus.objects.get()
    assert status.reset_requested_at is not None and status.reset_done_at is None
    assert selectors.dashboard_figures()["engines"][0]["reset_pending"] is True


@pytest.mark.django_db
def test_the_worker_carries_out_a_requested_reset_at_its_next_sample(monkeypatch):
    class FakeEngine:
        resets = 0

        def metrics(self):
            return fake_snapshot("worker-1")

        def reset_prefix_cache(self):
            self.resets += 1

    from chatapp.generation import embedded as host

    sampling.snapshot_record(snapshot=fake_snapshot("worker-1"))
    EngineStatus.objects.update(reset_requested_at=timezone.now())
    fake = FakeEngine()
    monkeypatch.setattr(host, "_engines", {"fake-model": fake})
    assert sampling.engine_sample_local() is True
    assert sampling.engine_sample_local() is True
    assert fake.resets == 1  # done once, not at every sample
    assert EngineStatus.objects.get().reset_done_at is not None


@pytest.mark.django_db
def test_a_worker_reports_its_kernel_path_and_it_is_shown_and_exported(client, staff_client,
                                                                     monkeypatch):
    from types import SimpleNamespace

    from chatapp.generation import embedded as host
    from kernels.cpu_features import cpu_path

    # The worker's side: its sample carries the path its own process took.
    config = SimpleNamespace(dtype="float32", weight_dtype="int4", kv_dtype="bfloat16")
    worker = SimpleNamespace(config=config, metrics=lambda: fake_snapshot("worker-1"),
                             engine=SimpleNamespace(config=config, cpu_path=cpu_path()))
    monkeypatch.setattr(host, "_engines", {"fake-model": worker})
    assert sampling.engine_sample_local() is True
    monkeypatch.setattr(host, "_engines", {})
    carried = EngineStatus.objects.get(engine_id="worker-1").snapshot
    assert (carried["cpu_path"], carried["dtype"], carried["weight_dtype"]) == (
        cpu_path(), "float32", "int4")
    # Another worker on another CPU, and one that predates the field.
    sampling.snapshot_record(snapshot=fake_snapshot(
        "worker-2", cpu_path="neon", dtype="bfloat16", weight_dtype="int8"))
    sampling.snapshot_record(snapshot=fake_snapshot("old-worker"))

    rows = {e["engine_id"]: e for e in selectors.dashboard_figures()["engines"]}
    assert (rows["worker-1"]["cpu_path"], rows["worker-1"]["weight_dtype"]) == (cpu_path(), "int4")
    assert (rows["worker-2"]["cpu_path"], rows["worker-2"]["dtype"]) == ("neon", "bfloat16")
    assert rows["old-worker"]["cpu_path"] is None

    page = staff_client.get("/admin/cache/").content.decode()
    assert (f'id="engine-worker-1-cpu-path" data-value="{cpu_path()}">{cpu_path()}</span>'
            " (float32 activations, int4 weights, bfloat16 KV cache)") in page
    assert 'id="engine-worker-2-cpu-path" data-value="neon"' in page
    assert 'id="engine-old-worker-cpu-path"' not in page

    text = client.get("/metrics").content.decode()
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "prefixchat:engine_info"]
    assert {s.labels["engine"]: (s.labels, s.value) for s in family.samples} == {
        "worker-1": ({"engine": "worker-1", "model": "fake-model", "model_path": "fake-model",
                      "cpu_path": cpu_path(),
                      "dtype": "float32", "weight_dtype": "int4",
                      "kv_dtype": "bfloat16"}, 1.0),
        "worker-2": ({"engine": "worker-2", "model": "fake-model", "model_path": "fake-model",
                      "cpu_path": "neon",
                      "dtype": "bfloat16", "weight_dtype": "int8", "kv_dtype": ""}, 1.0),
        "old-worker": ({"engine": "old-worker", "model": "fake-model", "model_path": "fake-model",
                      "cpu_path": "",
                        "dtype": "", "weight_dtype": "", "kv_dtype": ""}, 1.0),
    }


@pytest.mark.django_db
def test_a_failing_sample_never_raises(monkeypatch):
    class BrokenEngine:
        def metrics(self):
            raise RuntimeError("boom")

    from chatapp.generation import embedded as host

    monkeypatch.setattr(host, "_engines", {"fake-model": BrokenEngine()})
    assert sampling.Sampler(interval=1).run_once() is False

    healthy = type("E", (), {"metrics": lambda self: fake_snapshot()})()
    monkeypatch.setattr(host, "_engines", {"fake-model": healthy})
    monkeypatch.setattr(sampling.EngineSample.objects, "create",
                        lambda **kw: (_ for _ in ()).throw(RuntimeError("db down")))
    assert sampling.Sampler(interval=1).run_once() is False
    assert sampling.start_sampler() is None  # interval 0 in tests: no thread


@pytest.mark.django_db
def test_metrics_keep_the_local_engine_while_the_database_is_away(client, monkeypatch):
    from django.db import DatabaseError

    from chatapp.dashboard import engines

    def unreachable():
        raise DatabaseError("connection refused")

    monkeypatch.setattr(engines, "local_snapshots", lambda: [fake_snapshot("web")])
    monkeypatch.setattr(EngineStatus.objects, "all", unreachable)
    text = client.get("/metrics").content.decode()
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "prefixchat:prefix_cache_hits"]
    assert [(s.labels, s.value) for s in family.samples if s.name.endswith("_total")] == [
        ({"engine": "web", "model": "fake-model"}, 600.0)]


@pytest.mark.django_db
def test_the_host_disk_tier_and_why_matches_ended_are_shown_and_exported(client, staff_client):
    restore = {"buckets": [0.001, 0.01], "cumulative_counts": [2, 4, 4], "sum": 0.012,
               "count": 4}
    tier = dict(prefix_cache_hits_tier=320, kv_tier_memory_blocks=12,
                kv_tier_memory_bytes=4_423_680, kv_tier_disk_blocks=40,
                kv_tier_disk_bytes=14_745_600, kv_tier_offloads=52, kv_tier_restores=20,
                kv_tier_restore_seconds=restore,
                prefix_cache_miss_reasons={"full": 7, "evicted_pool": 2, "cold": 1})
    sampling.snapshot_record(snapshot=fake_snapshot("worker-1", **tier))
    # "salt" (cold misses on another tenant's tokens) is an aggregate count for the
    # operator only: no request's receipt says it.
    sampling.snapshot_record(snapshot=fake_snapshot(
        "worker-2", prefix_cache_miss_reasons={"full": 3, "salt": 1}))
    total = selectors.dashboard_figures()["total"]
    assert total["prefix_cache_hits_tier"] == 320 and total["kv_tier_restores"] == 20
    assert total["kv_tier_disk_bytes"] == 14_745_600
    assert total["miss_reasons"] == {"full": 10, "evicted_pool": 2, "cold": 1, "salt": 1}
    assert total["restore_ms_per_block"] == pytest.approx(0.6)

    page = staff_client.get("/admin/cache/").content.decode()
    assert "full 10 · evicted_pool 2" in page and "Host/disk tier" in page

    text = client.get("/metrics").content.decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("prefixchat:prefix_cache_match_end_total",
                    (*WORKER_1, ("reason", "evicted_pool")))] == 2
    assert samples[("prefixchat:prefix_cache_hits_tier_total",
                    WORKER_1)] == 320
    assert samples[("prefixchat:kv_tier_disk_bytes", WORKER_1)] == 14_745_600
    assert samples[("prefixchat:kv_tier_restore_seconds_count", WORKER_1)] == 4


@pytest.mark.django_db
def test_prefix_sharing_while_blocks_are_computed_is_summed_and_exported(client):
    sampling.snapshot_record(snapshot=fake_snapshot("worker-1", prefix_waits=3,
                                                    inflight_shared_blocks=40))
    sampling.snapshot_record(snapshot=fake_snapshot("worker-2", prefix_waits=1,
                                                    inflight_shared_blocks=2))
    total = selectors.dashboard_figures()["total"]
    assert (total["prefix_waits"], total["inflight_shared_blocks"]) == (4, 42)
    text = client.get("/metrics").content.decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("prefixchat:prefix_waits_total", WORKER_1)] == 3
    assert samples[("prefixchat:inflight_shared_blocks_total", WORKER_2)] == 2


def _requests(n: int, *, hit_every: int = 5) -> list[dict]:
    """n finished requests, one in `hit_every` a cache hit; TTFTs all differ."""
    return [{"request_id": f"api-{i}", "prompt_tokens": 100,
             "cached_tokens": 96 if i % hit_every == 0 else 0, "completion_tokens": 5,
             "ttft": 0.01 * (i + 1), "e2e": 1.0, "finish_reason": "stop"} for i in range(n)]


def test_with_one_engine_all_engines_agree_with_it():
    # More recent requests than the recent-hit-rate window: the TTFT figures once took the
    # window for the total and every request for the engine, so they disagreed.
    snap = fake_snapshot("web", recent_requests=_requests(60))
    engine = stats.engine_figures(snap, 50)
    total = stats.total_figures([snap], 50)
    assert total["ttft"] == engine["ttft"]
    assert total["ttft"]["miss"]["requests"] + total["ttft"]["hit"]["requests"] == 60
    assert total["recent"] == engine["recent"]
    for key in stats.SUMMED + ("hit_rate", "kv_cache_usage", "restore_ms_per_block"):
        assert total[key] == engine[key], key


def test_with_two_engines_the_total_takes_each_engines_requests():
    a = fake_snapshot("a", recent_requests=_requests(60))
    b = fake_snapshot("b", recent_requests=_requests(7, hit_every=2))
    total = stats.total_figures([a, b], 50)
    per = [stats.engine_figures(s, 50) for s in (a, b)]
    for kind in ("hit", "miss"):
        assert total["ttft"][kind]["requests"] == sum(f["ttft"][kind]["requests"] for f in per)
    assert total["recent"]["requests"] == 57


@pytest.mark.django_db
def test_the_page_has_jump_links_and_no_placeholder_for_missing_restores(staff_client):
    sampling.snapshot_record(snapshot=fake_snapshot("worker-1"))  # no tier, no restores
    page = staff_client.get("/admin/cache/").content.decode()
    assert "ms a block" not in page and "restore —" not in page
    toc = page[page.index('id="dash-toc"'):page.index("</nav>", page.index('id="dash-toc"'))]
    targets = re.findall(r'href="#([\w-]+)"', toc)
    assert len(targets) == 8  # the live sections, the profile, feedback and titles
    for target in targets:
        assert f'id="{target}"' in page, target


@pytest.mark.django_db
def test_missing_figures_are_said_in_words_never_a_dash(staff_client):
    def text() -> str:
        page = staff_client.get("/admin/cache/").content.decode()
        return re.sub(r"<[^>]+>", " ", page)

    empty = text()  # no engine has reported, no request, no reply
    assert "—" not in empty and "&mdash;" not in empty
    # An engine with no requests and no blocks: rates and TTFTs that cannot exist yet.
    sampling.snapshot_record(snapshot=fake_snapshot(
        "worker-1", prefix_cache_queries=0, prefix_cache_hits=0, hit_rate=None,
        blocks_total=0, blocks_used=0, blocks_cached_free=0, blocks_free=0,
        kv_cache_usage=None, requests_finished=0, recent_requests=[]))
    idle = text()
    assert "—" not in idle and "&mdash;" not in idle
    assert "no requests yet" in idle and "none yet" in idle
    # A request without a preset, a receipt, a TTFT or a finish reason.
    sampling.snapshot_record(snapshot=fake_snapshot("worker-1", recent_requests=[
        {"request_id": "api-1", "prompt_tokens": 10, "cached_tokens": 0}]))
    bare = text()
    assert "—" not in bare and "&mdash;" not in bare
    assert "no receipt" in bare and "no token" in bare
