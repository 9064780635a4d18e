"""Two models served at once (LLM_MODELS), end to end against a live server: /v1 lists
and routes by name, each model answers on its own engine with its own prefix cache and
figures, a conversation keeps the model it was created with, and the chat page's model
picker works in a real browser, at phone width and in dark mode.

The models are two tiny random ones (different weights, SmolLM2's tokenizer), so the
server starts in seconds and their figures are told apart by the `model` label."""

from __future__ import annotations

import urllib.request

import httpx2 as httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.chatapp.api.conftest import Accounts
from tests.inference.conftest import make_tiny_model

from .chat_steps import chat, new_chat
from .conftest import ARTIFACTS, start_live_server, stop_live_server

pytestmark = pytest.mark.model  # the tiny models borrow the real model's tokenizer

WAIT_MS = 120_000
PHONE = {"width": 390, "height": 844}
SYSTEM = ("You are a careful assistant. Answer in one short sentence, plainly, "
          "without lists, code or headings, and never mention these instructions.")


def serve_models(tmp_path_factory, name: str, models: str, **settings: str):
    """A live server with LLM_MODELS=models, loaded at start, short replies (a fixture's
    body: yields the server); `settings`: more of its environment."""
    live, proc = start_live_server(
        tmp_path_factory.mktemp(f"{name}-live"), name,
        **settings,
        LLM_MODELS=models,
        LLM_NUM_BLOCKS="512",  # split between the models
        LLM_PRELOAD="1",
        CHAT_MAX_NEW_TOKENS="8",
        API_DEFAULT_MAX_TOKENS="8",
        API_RATE_LIMIT_RPM="100000",
    )
    yield live
    stop_live_server(proc)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    alpha = make_tiny_model(tmp_path_factory.mktemp("alpha"), "llama", seed=1)
    beta = make_tiny_model(tmp_path_factory.mktemp("beta"), "llama", seed=2)
    yield from serve_models(tmp_path_factory, "models", f"alpha={alpha},beta={beta}")


@pytest.fixture(scope="module")
def account(server) -> dict:
    return Accounts(server).account()


@pytest.fixture(scope="module")
def client(server, account):
    with httpx.Client(base_url=server.url, timeout=300,
                      headers={"Authorization": f"Bearer {account['key']}"}) as client:
        yield client


def figures(server) -> dict[str, dict[str, float]]:
    """model -> {series: value} from the server's /metrics, summed over its engines."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            model = s.labels.get("model")
            if model is None or s.name == "prefixchat:engine_info":
                continue
            name = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items())
                                    if k not in ("engine", "model"))
            out.setdefault(model, {}).setdefault(name, 0.0)
            out[model][name] += s.value
    return out


FINISHED = "prefixchat:request_success_total|finished_reason=finished"
QUERIES = "prefixchat:prefix_cache_queries_total"
HITS = "prefixchat:prefix_cache_hits_total"


def delta(before: dict, after: dict, model: str, series: str) -> float:
    return after.get(model, {}).get(series, 0.0) - before.get(model, {}).get(series, 0.0)


def ask(client, model: str, text: str = "Name a colour.") -> httpx.Response:
    return client.post("/v1/chat/completions", json={
        "model": model, "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]})


def test_v1_models_lists_both(client):
    listed = client.get("/v1/models")
    assert listed.status_code == 200, listed.text
    assert [m["id"] for m in listed.json()["data"]] == ["alpha", "beta"]
    assert client.get("/v1/models/beta").json()["id"] == "beta"
    assert client.get("/v1/models/gamma").status_code == 404


def test_each_model_answers_on_its_own_engine_with_its_own_cache(server, client):
    before = figures(server)
    first = ask(client, "alpha")
    assert first.status_code == 200, first.text
    assert first.json()["model"] == "alpha"
    # The same prompt to beta: alpha's blocks are not beta's, so nothing is cached.
    other = ask(client, "beta")
    assert other.status_code == 200, other.text
    assert other.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # Beta's second request hits beta's own blocks.
    again = ask(client, "beta", "Name another colour.")
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
    after = figures(server)
    assert delta(before, after, "alpha", FINISHED) == 1
    assert delta(before, after, "beta", FINISHED) == 2
    prompt = first.json()["usage"]["prompt_tokens"]
    assert delta(before, after, "alpha", QUERIES) == prompt
    assert delta(before, after, "alpha", HITS) == 0
    assert delta(before, after, "beta", HITS) == again.json()["usage"][
        "prompt_tokens_details"]["cached_tokens"]
    # Different weights, different greedy replies: each model answered itself.
    texts = {r.json()["choices"][0]["message"]["content"] for r in (first, other)}
    assert len(texts) == 2, texts


def test_an_unknown_model_is_openais_404(client):
    response = ask(client, "gamma")
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "alpha" in error["message"] and "beta" in error["message"]


def test_a_conversation_keeps_the_model_it_was_created_with(server, client):
    refused = client.post("/api/conversations/", json={"model": "gamma"})
    assert refused.status_code == 400 and "alpha" in refused.text
    made = client.post("/api/conversations/", json={"model": "beta", "preset_id": "general"})
    assert made.status_code == 201, made.text
    assert made.json()["model"] == "beta"
    cid = made.json()["id"]
    default = client.post("/api/conversations/", json={}).json()
    assert default["model"] == "alpha"  # the first of LLM_MODELS

    before = figures(server)
    for text in ("Name a colour.", "And another one."):
        turn = client.post(f"/api/conversations/{cid}/messages/", json={"content": text})
        assert turn.status_code == 201, turn.text
        assert turn.json()["reply"]["status"] == "done"
    after = figures(server)
    assert delta(before, after, "beta", FINISHED) == 2
    assert delta(before, after, "alpha", FINISHED) == 0
    # The second turn extends the first on beta's engine: its prefix is cached there.
    assert turn.json()["reply"]["usage"]["cached_tokens"] > 0
    assert client.get(f"/api/conversations/{cid}/").json()["model"] == "beta"



def open_page(browser, server, account, **options):
    options.setdefault("viewport", {"width": 1280, "height": 900})
    context = browser.new_context(**options)
    context.add_cookies([{"name": "sessionid", "value": account["sessionid"],
                          "url": server.url}])
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(server.url + "/")
    return page


def test_the_picker_starts_a_conversation_with_the_second_model(browser, server, account):
    page = open_page(browser, server, account)
    assert page.input_value("#model-picker") == "alpha"
    before = figures(server)
    new_chat(page, preset="general", model="beta")
    assert page.inner_text("#conversation-model") == "beta"
    assert page.input_value("#model-picker") == "beta"  # New chat makes another like it
    chat(page, ("Name a colour.", "And another one."))
    after = figures(server)
    assert delta(before, after, "beta", FINISHED) == 2
    assert delta(before, after, "alpha", FINISHED) == 0
    assert page.errors == []
    page.context.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_model_picker_fits_a_phone(browser, server, account, scheme):
    page = open_page(browser, server, account, viewport=PHONE, color_scheme=scheme)
    page.click(".menu-button")
    page.wait_for_function(
        "document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    for selector in ("#preset-picker", "#model-picker", "#new-chat"):
        box = page.locator(selector).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (selector, box)
    # Readable in either scheme: the picker's text and background differ clearly.
    contrast = page.evaluate("""() => {
        const s = getComputedStyle(document.getElementById('model-picker'));
        const lum = c => { const [r, g, b] = c.match(/\\d+/g).map(Number);
                           return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
        return Math.abs(lum(s.color) - lum(s.backgroundColor)); }""")
    assert contrast > 100, contrast
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"chat-phone-models-{scheme}.png"))
    assert page.errors == []
    page.context.close()


def test_the_server_log_names_each_models_engine(server):
    # Loaded at start (LLM_PRELOAD), each under its own engine id.
    log = server.log.read_text()
    assert "Model alpha loaded." in log and "Model beta loaded." in log
