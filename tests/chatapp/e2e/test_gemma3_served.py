"""The real Gemma 3 270M GGUF served beside SmolLM2 (LLM_MODELS). Its file has no chat
template, so it is a base model: a completion model unless the operator serves it as a
chat model (LLM_FORCE_CHAT_TEMPLATE, as here, with Gemma 3's turn format). Over /v1,
with a shared system prompt served from its own prefix cache, on /v1/completions with
its prompt's logprobs, and in the chat page picked for a new conversation. Skipped
without the package (`make install-gemma3`)."""

from __future__ import annotations

import httpx2 as httpx
import pytest

from inference.loader import gemma3_gguf_path
from tests.chatapp.api.conftest import Accounts

from .chat_steps import chat, new_chat
from .test_several_models import FINISHED, delta, figures, open_page, serve_models

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(gemma3_gguf_path() is None,
                       reason="needs the Gemma 3 GGUF: make install-gemma3"),
]

SYSTEM = ("You are a careful assistant who answers every question in one short, plain "
          "sentence, without lists, code or headings. ") * 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve_models(tmp_path_factory, "gemma",
                            "smollm2=smollm2-135m-instruct,gemma=gemma3-270m",
                            LLM_FORCE_CHAT_TEMPLATE="gemma")


@pytest.fixture(scope="module")
def account(server) -> dict:
    return Accounts(server).account()


def test_gemma_answers_over_v1_and_reuses_a_shared_system_prompt(server, account):
    with httpx.Client(base_url=server.url, timeout=600,
                      headers={"Authorization": f"Bearer {account['key']}"}) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]][:2] == [
            "smollm2", "gemma"]
        usages = []
        for text in ("Name a colour.", "Name a fruit."):
            r = client.post("/v1/chat/completions", json={
                "model": "gemma", "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": text}]})
            assert r.status_code == 200, r.text
            assert r.json()["model"] == "gemma"
            assert r.json()["choices"][0]["message"]["content"].strip()
            usages.append(r.json()["usage"])
    second = usages[1]
    assert second["prompt_tokens_details"]["cached_tokens"] >= second["prompt_tokens"] - 3 * 16


def test_gemma_completes_text_and_scores_its_prompt(server, account):
    with httpx.Client(base_url=server.url, timeout=600,
                      headers={"Authorization": f"Bearer {account['key']}"}) as client:
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert models["gemma"]["kind"] == "chat"  # forced; its file has no template
        assert models["gemma"]["root"] == "gemma3-270m"
        prompt = "The capital of France is"
        r = client.post("/v1/completions", json={
            "model": "gemma3-270m", "prompt": prompt, "max_tokens": 4, "temperature": 0,
            "echo": True, "logprobs": 1})
        assert r.status_code == 200, r.text
        [choice] = r.json()["choices"]
    assert choice["text"].startswith(prompt) and len(choice["text"]) > len(prompt)
    logprobs = choice["logprobs"]
    # Its BOS first (added by the tokenizer: no text, no logprob), then the prompt's words.
    assert logprobs["tokens"][0] == "<bos>" and logprobs["token_logprobs"][0] is None
    assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])
    assert "".join(logprobs["tokens"][1:]) == choice["text"]


def test_the_chat_page_picks_gemma_for_a_new_conversation(browser, server, account):
    page = open_page(browser, server, account)
    before = figures(server)
    new_chat(page, model="gemma")
    chat(page, ["Name a colour."])
    after = figures(server)
    assert delta(before, after, "gemma", FINISHED) == 1
    assert delta(before, after, "smollm2", FINISHED) == 0
    assert page.errors == []
    page.context.close()
