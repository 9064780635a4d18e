import pytest


@pytest.fixture(autouse=True)
def no_sampler_thread(settings):
    """Tests call the sampling function themselves; no background thread writes rows."""
    settings.DASHBOARD_SAMPLE_INTERVAL_S = 0


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user(
        "operator", password="operator-pass-123", is_staff=True, is_superuser=True
    )


@pytest.fixture
def staff_client(client, staff):
    client.force_login(staff)
    return client


@pytest.fixture
def member(django_user_model):
    return django_user_model.objects.create_user("member", password="member-pass-123")


def fake_snapshot(engine_id: str = "worker-1", **over) -> dict:
    """A snapshot shaped like AsyncEngine.metrics(), for engines this process does not host."""
    hist = {"buckets": [0.1, 1.0], "cumulative_counts": [1, 3, 3], "sum": 1.5, "count": 3}
    snap = {
        "engine_id": engine_id, "model": "fake-model", "prefix_cache_queries": 1000,
        "prefix_cache_hits": 600, "hit_rate": 0.6, "blocks_total": 100, "blocks_used": 10,
        "blocks_cached_free": 30, "blocks_free": 60, "kv_cache_usage": 0.1, "block_size": 16,
        "evictions": 2, "preemptions": 1, "num_running": 1, "num_waiting": 2,
        "prompt_tokens_total": 1000, "generation_tokens_total": 50, "requests_finished": 3,
        "requests_failed": 0, "requests_aborted": 0, "ttft_seconds": hist,
        "inter_token_latency_seconds": hist, "e2e_request_latency_seconds": hist,
        "recent_requests": [
            {"request_id": "api-1", "prompt_tokens": 100, "cached_tokens": 0,
             "completion_tokens": 5, "ttft": 0.5, "e2e": 1.0, "finish_reason": "stop"},
            {"request_id": "api-2", "prompt_tokens": 100, "cached_tokens": 96,
             "completion_tokens": 5, "ttft": 0.05, "e2e": 0.5, "finish_reason": "stop"},
        ],
    }
    snap.update(over)
    return snap
