"""The official `openai` package against the live server and the real model: penalties,
logit_bias, top_k / min_p / repetition_penalty, unknown fields refused, and logprobs
whose bytes make the content exactly."""

from __future__ import annotations

import openai
import pytest

from tests.chatapp.api.conftest import MODEL

pytestmark = pytest.mark.model

SAY = [{"role": "user", "content": "Say hello in one short sentence."}]
QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]


def test_every_sampling_field_is_taken(openai_client):
    done = openai_client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=8, temperature=0.8, seed=3,
        presence_penalty=0.5, frequency_penalty=0.5, logit_bias={"50": -100},
        extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    assert done.choices[0].message.content


def test_logit_bias_forces_and_bans_tokens(openai_client, tokenizer):
    [banana] = tokenizer.encode(" banana", add_special_tokens=False)
    forced = openai_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4,
                                            temperature=0, logit_bias={str(banana): 100})
    assert forced.choices[0].message.content == " banana" * 4

    plain = openai_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3,
                                           temperature=0, logprobs=True)
    first = plain.choices[0].logprobs.content[0]
    [first_id] = tokenizer.encode(bytes(first.bytes).decode(), add_special_tokens=False)
    banned = openai_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3,
                                            temperature=0, logprobs=True,
                                            logit_bias={str(first_id): -100})
    assert banned.choices[0].logprobs.content[0].token != first.token


def test_ignore_eos_and_min_tokens_set_the_reply_s_length(openai_client):
    exact = openai_client.chat.completions.create(model=MODEL, messages=SAY, max_tokens=24,
                                           temperature=0,
                                           extra_body={"ignore_eos": True, "min_tokens": 24})
    assert exact.usage.completion_tokens == 24
    assert exact.choices[0].finish_reason == "length"
    natural = openai_client.chat.completions.create(model=MODEL, messages=SAY, max_tokens=60,
                                             temperature=0)
    short = natural.usage.completion_tokens
    assert natural.choices[0].finish_reason == "stop" and short < 40
    longer = openai_client.chat.completions.create(model=MODEL, messages=SAY, max_tokens=60,
                                            temperature=0, extra_body={"min_tokens": short + 5})
    assert longer.usage.completion_tokens >= short + 5


@pytest.mark.parametrize("extra, param", [
    ({"logit_bias": {"49152": 1}}, "logit_bias"),  # past SmolLM2's vocabulary
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"top_k": "many"}, "top_k"),
    ({"max_token": 5}, "max_token"),  # a typo: refused, never ignored
])
def test_a_bad_or_unknown_field_is_a_400_naming_it(openai_client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        openai_client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2,
                                       extra_body=extra)
    assert err.value.body["param"] == param, err.value.body


def _joined(content) -> bytes:
    return b"".join(bytes(t.bytes) for t in content)


def test_logprobs_make_the_content_exactly(openai_client):
    """A mix of endings: the end token, a stop string (inside a token and at a token's
    start), the length; n = 1 and 2; each whole and streamed: 50 requests."""
    base = openai_client.chat.completions.create(model=MODEL, messages=SAY, max_tokens=60,
                                          temperature=0, logprobs=True, top_logprobs=2)
    [choice] = base.choices
    text = choice.message.content
    assert choice.finish_reason == "stop" and len(text) > 12, text
    # The end token was generated and counted, and is not in the logprobs.
    assert len(choice.logprobs.content) < base.usage.completion_tokens
    assert _joined(choice.logprobs.content) == text.encode()

    words = text.split()
    requests = [
        dict(messages=SAY, max_tokens=60, temperature=0),
        dict(messages=SAY, max_tokens=60, temperature=0, stop=[text[5:8]]),
        dict(messages=SAY, max_tokens=60, temperature=0, stop=[" " + words[2]]),
        dict(messages=QUESTION, max_tokens=7, temperature=0),
        dict(messages=QUESTION, max_tokens=40, temperature=1.0, seed=5, n=2, stop=["e"]),
        dict(messages=SAY, max_tokens=40, temperature=1.0, seed=9, n=2),
    ]
    # Sampled replies with short stop strings, one or two choices: 25 kinds of request,
    # each whole and streamed, 50 in all.
    stops = [None, ["e"], [" the"], ["."], ["s", ","]]
    requests += [dict(messages=(SAY, QUESTION)[seed % 2], max_tokens=24, temperature=1.0,
                      seed=100 + seed, n=1 + seed % 2, stop=stops[seed % len(stops)])
                 for seed in range(19)]
    assert len(requests) * 2 == 50
    for kw in requests:
        done = openai_client.chat.completions.create(model=MODEL, logprobs=True, top_logprobs=1, **kw)
        for c in done.choices:
            assert _joined(c.logprobs.content) == c.message.content.encode(), (kw, c)
            assert all(len(t.top_logprobs) == 1 for t in c.logprobs.content)

        stream = openai_client.chat.completions.create(model=MODEL, logprobs=True, stream=True, **kw)
        text_of, bytes_of = {}, {}
        for chunk in stream:
            for c in chunk.choices:
                text_of[c.index] = text_of.get(c.index, "") + (c.delta.content or "")
                if c.logprobs:
                    bytes_of[c.index] = bytes_of.get(c.index, b"") + _joined(c.logprobs.content)
        assert set(text_of) == {c.index for c in done.choices}
        for i, streamed in text_of.items():
            assert bytes_of.get(i, b"") == streamed.encode(), (kw, i)
