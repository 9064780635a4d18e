"""POST /v1/completions (the legacy completions API) through the official `openai`
package against the live server and the real SmolLM2: prompts as text, token ids and
batches, n, stream, stop, legacy logprobs, echo with the prompt's own logprobs, the
prefix cache within a tenant, and a 400 (or 404) for each thing a client can get wrong."""

from __future__ import annotations

import uuid

import httpx2 as httpx
import openai
import pytest

from tests.chatapp.api.conftest import MODEL

pytestmark = pytest.mark.model

PROMPT = "The three primary colours are red,"


def greedy(openai_client, prompt, **kw):
    return openai_client.completions.create(model=MODEL, prompt=prompt, temperature=0,
                                     **{"max_tokens": 8, **kw})


def test_a_text_prompt_is_continued(openai_client):
    done = greedy(openai_client, PROMPT)
    assert done.object == "text_completion" and done.id.startswith("cmpl-")
    assert done.model == MODEL
    [choice] = done.choices
    assert choice.index == 0 and choice.text and choice.logprobs is None
    assert choice.finish_reason in ("stop", "length")
    usage = done.usage
    assert usage.prompt_tokens > 0 and 1 <= usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens is not None


def test_token_ids_are_the_same_prompt_as_their_text(openai_client, tokenizer):
    ids = tokenizer.encode(PROMPT)
    as_text, as_ids = greedy(openai_client, PROMPT), greedy(openai_client, ids)
    assert as_ids.choices[0].text == as_text.choices[0].text
    assert as_ids.usage.prompt_tokens == len(ids) == as_text.usage.prompt_tokens


def test_a_batch_with_n_numbers_choices_prompt_by_prompt(openai_client, tokenizer):
    other = "Once upon a time, in a small village,"
    done = openai_client.completions.create(model=MODEL, prompt=[PROMPT, tokenizer.encode(other)],
                                     n=2, max_tokens=6, temperature=0)
    assert [c.index for c in done.choices] == [0, 1, 2, 3]
    texts = [c.text for c in done.choices]
    # Greedy: both samples of a prompt agree, and each is that prompt's continuation.
    assert texts[0] == texts[1] == greedy(openai_client, PROMPT, max_tokens=6).choices[0].text
    assert texts[2] == texts[3] == greedy(openai_client, other, max_tokens=6).choices[0].text
    single = greedy(openai_client, PROMPT, max_tokens=6).usage.prompt_tokens
    assert done.usage.prompt_tokens == single + len(tokenizer.encode(other))


def test_n_samples_with_a_seed_repeat(openai_client):
    def run():
        done = openai_client.completions.create(model=MODEL, prompt=PROMPT, n=3, seed=7,
                                         max_tokens=8, temperature=1.0)
        return [c.text for c in done.choices]

    first = run()
    assert first == run()
    assert len(set(first)) > 1  # each sample draws its own


def test_streaming_gives_the_same_text_and_the_usage_last(openai_client):
    whole = greedy(openai_client, PROMPT).choices[0].text
    chunks = list(openai_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    parts = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in parts) == whole
    assert parts[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1


def test_stop_cuts_the_text_before_the_stop_string(openai_client):
    text = greedy(openai_client, PROMPT, max_tokens=12).choices[0].text
    words = text.split()
    assert len(words) >= 2, text
    cut = greedy(openai_client, PROMPT, max_tokens=12, stop=[words[1], "zzzq"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(words[1])]


def check_legacy(logprobs, text: str, k: int) -> None:
    """tokens make the text, text_offset says where each starts, top maps per token."""
    n = len(logprobs.tokens)
    assert len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == len(
        logprobs.text_offset) == n
    assert "".join(logprobs.tokens).endswith(text[logprobs.text_offset[0]:])
    for i, token in enumerate(logprobs.tokens):
        assert text[logprobs.text_offset[i]:].startswith(token)
        if logprobs.token_logprobs[i] is not None:
            assert logprobs.token_logprobs[i] <= 0
            assert len(logprobs.top_logprobs[i]) <= k


def test_logprobs_in_the_legacy_shape(openai_client):
    done = greedy(openai_client, PROMPT, logprobs=3)
    [choice] = done.choices
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset[0] == 0
    check_legacy(lp, choice.text, 3)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs,
                                   strict=True):
        # Greedy: the token taken is the most likely one.
        assert max(top.values()) == pytest.approx(logprob, abs=1e-6)
        assert top[token] == pytest.approx(logprob, abs=1e-6)


def test_echo_gives_the_prompt_and_the_logprobs_the_model_gave_its_tokens(openai_client, tokenizer):
    made = greedy(openai_client, PROMPT, max_tokens=4, logprobs=1)
    generated = made.choices[0].logprobs
    ids = tokenizer.encode(PROMPT + made.choices[0].text)
    echoed = greedy(openai_client, ids, max_tokens=1, logprobs=2, echo=True)
    [choice] = echoed.choices
    lp = choice.logprobs
    prompt_text = tokenizer.decode(ids)
    assert choice.text.startswith(prompt_text)
    assert len(lp.tokens) == len(ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    check_legacy(lp, choice.text, 2)
    # The prompt's last tokens are the ones generated before: computed in one prefill now,
    # they have the logprobs the engine gave them one decode step at a time (to the int8
    # KV rows' rounding, which a decode step reads and a prefill does not).
    tail = len(generated.tokens)
    assert lp.tokens[len(ids) - tail: len(ids)] == generated.tokens
    assert lp.token_logprobs[len(ids) - tail: len(ids)] == pytest.approx(
        generated.token_logprobs, abs=2e-2)
    # Scoring reads nothing from the cache: every prompt position is computed.
    assert echoed.usage.prompt_tokens_details.cached_tokens == 0


def test_echo_without_logprobs_and_streamed(openai_client):
    plain = greedy(openai_client, PROMPT, echo=True)
    assert plain.choices[0].text == PROMPT + greedy(openai_client, PROMPT).choices[0].text
    chunks = list(openai_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4,
                                            temperature=0, echo=True, logprobs=0,
                                            stream=True))
    assert chunks[0].choices[0].text.startswith(PROMPT)
    text = "".join(c.choices[0].text for c in chunks)
    tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]
    assert "".join(tokens) == text and offsets == sorted(offsets)


def test_the_prefix_cache_serves_a_prompt_again_within_its_tenant_only(
        accounts, client_for, openai_client):
    document = f"Ticket {uuid.uuid4().hex}. " + " ".join(
        f"Step {i}: check the cable and restart the router." for i in range(30))
    first = greedy(openai_client, document, max_tokens=2)
    assert first.usage.prompt_tokens >= 300
    again = greedy(openai_client, document, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens >= (
        first.usage.prompt_tokens - 1) // 16 * 16
    _, other_key = accounts.user_with_key()
    other = greedy(client_for(other_key), document, max_tokens=2)
    assert other.usage.prompt_tokens_details.cached_tokens == 0


def test_the_models_list_describes_each_model(openai_client, api_server):
    from inference.model_file import created, model_file

    models = openai_client.models.list().data
    [entry] = [m for m in models if m.id == MODEL]
    extra = entry.model_dump()
    assert extra["kind"] == "chat" and extra["root"] == MODEL and MODEL in extra["aliases"]
    assert extra["context_length"] == extra["max_model_len"] > 0
    assert extra["weight_dtype"] in ("int4", "int8", "bf16", "fp32")
    assert extra["kernel_path"]  # the loaded engine's
    assert entry.created == created() == int(model_file().stat().st_mtime)
    assert openai_client.models.retrieve(MODEL).model_dump() == extra
    ready = httpx.get(api_server.url + "/readyz").json()
    [card] = ready["models"]
    assert card["alias"] == MODEL and card["context_length"] == extra["context_length"]


REFUSALS = [
    ({"suffix": " and that is all."}, 400, "suffix", "unsupported_parameter"),
    ({"max_token": 5}, 400, "max_token", "unknown_parameter"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "messages", "unknown_parameter"),
    ({"best_of": 3}, 400, "best_of", "unsupported_value"),
    ({"prompt": ""}, 400, "prompt", "invalid_value"),
    ({"prompt": []}, 400, "prompt", "empty_array"),
    ({"prompt": [1, -2]}, 400, "prompt", "invalid_type"),
    ({"prompt": ["ok", 3.5]}, 400, "prompt[1]", "invalid_type"),
    ({"prompt": [10**8]}, 400, "prompt", None),
    ({"prompt": "word " * 20000}, 400, "prompt", "context_length_exceeded"),
    ({"max_tokens": 100000}, 400, "prompt", "context_length_exceeded"),
    ({"prompt": ["a"] * 65}, 400, "prompt", "invalid_value"),
    ({"n": 9}, 400, "n", "invalid_value"),
    ({"logprobs": 21}, 400, "logprobs", "invalid_value"),
    ({"logprobs": True}, 400, "logprobs", "invalid_type"),
    ({"echo": "yes"}, 400, "echo", "invalid_type"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options", "invalid_value"),
    ({"temperature": 3}, 400, "temperature", "invalid_value"),
    ({"logit_bias": {"x": 1}}, 400, "logit_bias", "invalid_value"),
    ({"cache_salt": "mine"}, 400, "cache_salt", "cache_salt_not_allowed"),
    ({"model": "no-such-model"}, 404, "model", "model_not_found"),
]


@pytest.mark.parametrize(("fields", "status", "param", "code"), REFUSALS,
                         ids=[next(iter(f)) + f"-{i}" for i, (f, *_) in enumerate(REFUSALS)])
def test_each_refusal_is_an_openai_error_naming_the_field(openai_client, fields, status, param, code):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, **fields}
    with pytest.raises(openai.APIStatusError) as err:
        openai_client.completions.create(**{k: body.pop(k) for k in ("model", "prompt")},
                                  extra_body=body)
    assert err.value.status_code == status
    error = err.value.body
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert error["type"] == "invalid_request_error" and error["message"]


def test_a_request_without_a_key_or_over_the_rate_is_refused(accounts, client_for):
    with pytest.raises(openai.AuthenticationError):
        client_for("sk-not-a-key").completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    _, key = accounts.user_with_key(rpm=1)
    limited = client_for(key)
    greedy(limited, PROMPT, max_tokens=1)
    with pytest.raises(openai.RateLimitError):
        greedy(limited, PROMPT, max_tokens=1)
