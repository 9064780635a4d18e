"""A base model (its file carries no chat template) served beside a chat model
(LLM_MODELS), against a live server: it is a completion model, listed with its kind,
answered on /v1/completions, refused on /v1/chat/completions and for conversations with
a 400 that says why, and left out of the chat page's model picker; each model answers
to its own name as well as its alias.

The models are two tiny random ones with SmolLM2's tokenizer: one keeps the chat
template beside it, the other has it taken away, as a base model's file has none."""

from __future__ import annotations

import json

import httpx2 as httpx
import openai
import pytest

from tests.chatapp.api.conftest import Accounts
from tests.chatapp.e2e.conftest import start_live_server, stop_live_server
from tests.inference.conftest import make_tiny_model

pytestmark = pytest.mark.model  # the tiny models borrow the real model's tokenizer


def base_model(dest):
    """A tiny model whose folder holds no chat template."""
    make_tiny_model(dest, "llama", seed=3)
    (dest / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    chat = make_tiny_model(tmp_path_factory.mktemp("tiny-chat"), "llama", seed=1)
    base = base_model(tmp_path_factory.mktemp("tiny-base"))
    more = make_tiny_model(tmp_path_factory.mktemp("tiny-more"), "llama", seed=2)
    live, proc = start_live_server(
        tmp_path_factory.mktemp("base-live"), "base-models",
        LLM_MODELS=f"talk={chat},base={base},more={more}", LLM_NUM_BLOCKS="256", LLM_PRELOAD="1",
        API_RATE_LIMIT_RPM="100000", CHAT_MAX_NEW_TOKENS="4")
    live.chat_dir, live.base_dir = chat, base
    yield live
    stop_live_server(proc)


@pytest.fixture(scope="module")
def account(server) -> dict:
    return Accounts(server).account()


@pytest.fixture(scope="module")
def client(server, account):
    return openai.OpenAI(api_key=account["key"], base_url=server.url + "/v1", max_retries=0,
                         timeout=300)


def test_the_models_list_gives_each_its_kind_and_names(server, client):
    entries = {m.id: m.model_dump() for m in client.models.list().data}
    assert list(entries) == ["talk", "base", "more"]
    assert entries["talk"]["kind"] == "chat" and entries["base"]["kind"] == "completion"
    assert entries["base"]["root"] == server.base_dir.name
    assert entries["base"]["aliases"] == ["base", server.base_dir.name]
    assert entries["base"]["created"] == int((server.base_dir / "config.json").stat().st_mtime)
    ready = httpx.get(server.url + "/readyz").json()
    assert [(m["alias"], m["kind"]) for m in ready["models"]] == [
        ("talk", "chat"), ("base", "completion"), ("more", "chat")]


def test_a_base_model_is_refused_on_chat_completions_saying_why(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="base", max_tokens=2,
                                       messages=[{"role": "user", "content": "Hi"}])
    error = err.value.body
    assert (error["param"], error["code"]) == ("model", "model_not_chat")
    assert "chat template" in error["message"] and "/v1/completions" in error["message"]


def test_a_base_model_is_refused_on_responses_too(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="base", input="Hi", max_output_tokens=16)
    assert (err.value.body["param"], err.value.body["code"]) == ("model", "model_not_chat")


def test_a_base_model_completes_text_and_scores_its_prompt(client):
    done = client.completions.create(model="base", prompt="Once upon a time", max_tokens=3,
                                     temperature=0, echo=True, logprobs=1)
    [choice] = done.choices
    assert choice.text.startswith("Once upon a time")
    assert choice.logprobs.token_logprobs[0] is None
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs[1:])
    assert done.usage.completion_tokens == 3


def test_each_model_answers_to_its_own_name(server, client):
    own = server.chat_dir.name
    done = client.chat.completions.create(model=own, max_tokens=2,
                                          messages=[{"role": "user", "content": "Hi"}])
    assert done.model == own
    assert client.models.retrieve(own).model_dump()["root"] == own
    text = client.completions.create(model=server.base_dir.name, prompt="Hello", max_tokens=2)
    assert text.usage.completion_tokens == 2


def test_no_conversation_on_a_base_model_and_no_place_in_the_picker(server, account):
    with httpx.Client(base_url=server.url, timeout=60,
                      headers={"Authorization": f"Bearer {account['key']}"}) as api:
        refused = api.post("/api/conversations/", json={"model": "base"})
        assert refused.status_code == 400 and "chat template" in refused.text
        assert api.post("/api/conversations/", json={"model": "talk"}).status_code == 201
    page = httpx.get(server.url + "/", cookies={"sessionid": account["sessionid"]}).text
    assert 'value="talk"' in page and 'value="more"' in page
    assert 'value="base"' not in page
