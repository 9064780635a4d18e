"""Acceptance 4: keys are stored hashed, made and revoked in the UI (at once), and a key
reaches only its owner's conversations."""

from __future__ import annotations

import hashlib
import re
import sqlite3

import httpx2 as httpx
import pytest


def _db_rows(server) -> list[tuple]:
    path = server.env["DATABASE_URL"].removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        return db.execute("SELECT * FROM api_apikey").fetchall()


def test_database_holds_only_a_hash(api_server, accounts):
    user = accounts.user()
    key = accounts.command_key(user["username"], "--name", "hash check")
    prefix, secret = key.split(".", 1)
    rows = _db_rows(api_server)
    stored = " ".join(str(v) for row in rows for v in row)
    assert secret not in stored and key not in stored
    assert hashlib.sha256(key.encode()).hexdigest() in stored
    assert prefix in stored  # listed by its prefix


def _browser(server, user) -> httpx.Client:
    client = httpx.Client(base_url=server.url, timeout=60)
    client.cookies.set("sessionid", user["sessionid"])
    return client


def _csrf(page: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)


def test_key_made_in_the_page_is_shown_once_and_revoked_at_once(api_server, accounts):
    user = accounts.user()
    browser = _browser(api_server, user)
    page = browser.get("/keys/")
    assert page.status_code == 200 and user["key"].split(".")[0] in page.text
    made = browser.post("/keys/", data={"name": "ci", "csrfmiddlewaretoken": _csrf(page.text)},
                        headers={"Referer": api_server.url + "/keys/"})
    assert made.status_code == 200
    key = re.search(r'<code id="new-key">([^<]+)</code>', made.text).group(1)
    prefix = key.split(".")[0]
    assert made.headers["Cache-Control"] == "no-store"

    again = browser.get("/keys/")
    assert key not in again.text and key.split(".")[1] not in again.text
    assert f"{prefix}…" in again.text  # listed by prefix only

    bearer = {"Authorization": f"Bearer {key}"}
    assert httpx.get(api_server.url + "/v1/models", headers=bearer).status_code == 200
    assert httpx.get(api_server.url + "/api/conversations/", headers=bearer).status_code == 200

    key_id = re.search(rf'<code>{prefix}…</code>.*?action="/keys/(\d+)/revoke/"', again.text,
                       re.S).group(1)
    revoked = browser.post(f"/keys/{key_id}/revoke/",
                           data={"csrfmiddlewaretoken": _csrf(again.text)},
                           headers={"Referer": api_server.url + "/keys/"})
    assert revoked.status_code == 302
    # The very next request is refused, on both APIs.
    v1 = httpx.get(api_server.url + "/v1/models", headers=bearer)
    assert v1.status_code == 401 and v1.json()["error"]["code"] == "invalid_api_key"
    api = httpx.get(api_server.url + "/api/conversations/", headers=bearer)
    assert api.status_code == 401
    assert re.search(rf"{prefix}….*?revoked", browser.get("/keys/").text, re.S)


def test_someone_elses_key_cannot_be_revoked(api_server, accounts):
    owner, _ = accounts.user_with_key()
    intruder = _browser(api_server, accounts.user())
    page = _browser(api_server, owner).get("/keys/")
    key_id = re.search(r'action="/keys/(\d+)/revoke/"', page.text).group(1)
    token = _csrf(intruder.get("/keys/").text)
    response = intruder.post(f"/keys/{key_id}/revoke/", data={"csrfmiddlewaretoken": token},
                             headers={"Referer": api_server.url + "/keys/"})
    assert response.status_code == 404


def test_anonymous_key_page_redirects_to_login(api_server):
    response = httpx.get(api_server.url + "/keys/")
    assert response.status_code == 302 and "/accounts/login/" in response.headers["location"]


@pytest.fixture(scope="module")
def two_users(accounts):
    alice, alice_key = accounts.user_with_key()
    bob, bob_key = accounts.user_with_key()
    return alice, alice_key, bob, bob_key


def test_a_key_reaches_only_its_owners_conversations(api_server, two_users):
    alice, alice_key, bob, _ = two_users
    api = httpx.Client(base_url=api_server.url + "/api",
                       headers={"Authorization": f"Bearer {alice_key}"}, timeout=60)
    theirs = bob["conversation_id"]
    mine = alice["conversation_id"]
    listed = api.get("/conversations/").json()
    assert [c["id"] for c in listed["results"]] == [mine]
    for method, path, body in [
        ("GET", f"/conversations/{theirs}/", None),
        ("PATCH", f"/conversations/{theirs}/", {"title": "mine now"}),
        ("DELETE", f"/conversations/{theirs}/", None),
        ("GET", f"/conversations/{theirs}/messages/", None),
        ("POST", f"/conversations/{theirs}/messages/", {"content": "hi"}),
        ("GET", f"/conversations/{theirs}/export/", None),
        ("GET", f"/conversations/{theirs}/export/markdown/", None),
        ("POST", f"/conversations/{theirs}/messages/1/stop/", None),
    ]:
        response = api.request(method, path, json=body)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["code"] == "not_found"
    # Bob's conversation is untouched.
    bob_api = httpx.Client(base_url=api_server.url + "/api",
                           headers={"Authorization": f"Bearer {two_users[3]}"}, timeout=60)
    got = bob_api.get(f"/conversations/{theirs}/").json()
    assert got["title"] == "" and got["message_count"] == 0


def test_api_without_credentials(api_server):
    response = httpx.get(api_server.url + "/api/conversations/")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
