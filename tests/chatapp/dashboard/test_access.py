"""Who may see what: staff-only dashboard and reset, the metrics token, health endpoints."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry

from chatapp.dashboard.models import EngineStatus
from chatapp.dashboard.sampling import snapshot_record

from .conftest import fake_snapshot

pytestmark = pytest.mark.django_db

ADMIN_PAGES = ["/admin/cache/", "/admin/cache/data/", "/admin/cache/reset/worker-1/"]


@pytest.fixture(autouse=True)
def no_local_engine(monkeypatch):
    """These tests never load the model: this process hosts no engine."""
    from chatapp.generation import embedded as host

    monkeypatch.setattr(host, "_engines", {})


@pytest.mark.parametrize("url", ADMIN_PAGES)
def test_anonymous_and_non_staff_are_sent_to_the_admin_login(client, member, url):
    for logged_in in (False, True):
        if logged_in:
            client.force_login(member)
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_non_staff_cannot_reset(client, member):
    snapshot_record(snapshot=fake_snapshot())
    client.force_login(member)
    response = client.post("/admin/cache/reset/worker-1/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert EngineStatus.objects.get().reset_requested_at is None
    assert not LogEntry.objects.exists()


def test_staff_without_change_rights_cannot_reset(client, django_user_model):
    snapshot_record(snapshot=fake_snapshot())
    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    client.force_login(viewer)
    assert client.get("/admin/cache/").status_code == 200
    assert client.post("/admin/cache/reset/worker-1/").status_code == 403
    assert EngineStatus.objects.get().reset_requested_at is None


def test_the_admin_index_links_to_the_dashboard(staff_client):
    page = staff_client.get("/admin/").content.decode()
    assert 'href="/admin/cache/"' in page


def test_without_any_engine_the_page_still_renders(staff_client):
    response = staff_client.get("/admin/cache/")
    assert response.status_code == 200
    assert b"No engine has loaded or reported yet" in response.content
    assert b"no samples yet" in response.content


def test_unknown_engine_reset_is_an_error_message_not_a_crash(staff_client):
    response = staff_client.post("/admin/cache/reset/nope/", follow=True)
    assert response.status_code == 200 and b"No engine named" in response.content
    assert not LogEntry.objects.exists()


def test_metrics_token(client, settings):
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    ok = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert ok.status_code == 200 and ok["Content-Type"].startswith("text/plain")


def test_healthz_is_alive_and_readyz_wants_a_model(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    response = client.get("/readyz")
    body = response.json()
    assert response.status_code == 503 and body["status"] == "unready"
    assert body["checks"]["model"]["ok"] is False and body["checks"]["database"]["ok"] is True


def test_readyz_is_ready_with_a_model_and_a_database(client, monkeypatch):
    from chatapp.generation import embedded as host

    monkeypatch.setattr(host, "_engines", {host.served_models.default_alias(): object()})
    response = client.get("/readyz")
    assert response.status_code == 200 and response.json()["status"] == "ready"


def test_readyz_says_which_kernel_path_and_dtypes_the_loaded_engine_took(client, monkeypatch):
    from types import SimpleNamespace

    from chatapp.generation import embedded as host
    from kernels.cpu_features import cpu_path

    # Shaped like AsyncEngine: the kernel path is on the LLMEngine it wraps.
    config = SimpleNamespace(dtype="float32", weight_dtype="int4", kv_dtype="bfloat16")
    stand_in = SimpleNamespace(config=config,
                               engine=SimpleNamespace(config=config, cpu_path=cpu_path()))
    monkeypatch.setattr(host, "_engines", {host.served_models.default_alias(): stand_in})
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"]["model"] == {
        "ok": True, "detail": "loaded", "cpu_path": cpu_path(), "dtype": "float32",
        "weight_dtype": "int4", "kv_dtype": "bfloat16"}


def test_readyz_checks_redis_where_configured(client, monkeypatch, settings):
    from chatapp.generation import embedded as host

    monkeypatch.setattr(host, "_engines", {host.served_models.default_alias(): object()})
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["redis"]["ok"] is False
