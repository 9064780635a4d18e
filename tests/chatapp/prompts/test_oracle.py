"""Acceptance 2: the token-level prompt equals the tokenizer's own chat template where
reply texts re-encode to the generated ids, and keeps the generated ids where they do not."""

from __future__ import annotations

import pytest

from chatapp.prompts.presets import get_preset
from tests.chatapp.prompts.conftest import (
    canonical,
    common_prefix_len,
    is_strict_prefix,
    v1_turns,
)

USERS = ["Hello!", "What is a prime number?", "Give me two examples.", "Thanks, bye."]
REPLIES = [
    "Hi! How can I help you today?",
    "A number with exactly two divisors.",
    "2 and 3.",
    "Bye!",
]


def oracle(tokenizer, messages) -> list[int]:
    """The tokenizer's own chat template: what a server that re-renders text would send."""
    return list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


def run_turns(builder, system_ids, turns, replies_ids):
    history, plans = [], []
    for turn in range(turns):
        plan = builder.build(system_ids, history, USERS[turn])
        plans.append(plan)
        history += [list(plan.new_user_segment), builder.assistant_segment(replies_ids[turn], True)]
    return plans


@pytest.mark.parametrize("turns", [1, 2, 3, 4])
def test_equals_the_tokenizer_template_when_replies_re_encode(unpadded, builder, tokenizer, turns):
    system_text = get_preset("general").render()
    replies = [canonical(tokenizer, r) for r in REPLIES]
    assert all(canonical(tokenizer, tokenizer.decode(ids)) == ids for ids in replies)
    messages = [{"role": "system", "content": system_text}]
    for turn in range(turns):
        messages.append({"role": "user", "content": USERS[turn]})
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": REPLIES[turn]})
    expected = oracle(tokenizer, messages)

    # Without padding (block size 1) the prompt is the oracle, token for token.
    plan = run_turns(unpadded, unpadded.system_segment("general"), turns, replies)[-1]
    assert list(plan.token_ids) == expected

    # With 16-token blocks only the filler inside the system turn differs.
    system = builder.system_segment("general")
    padded = run_turns(builder, system, turns, replies)[-1]
    oracle_system = oracle(tokenizer, messages[:1])[: -len(builder.generation_prompt())]
    filler = len(system) - len(oracle_system)
    assert 0 <= filler < 16 and len(system) % 16 == 0
    assert system[: len(oracle_system) - 2] == oracle_system[:-2]  # text of the system turn
    assert system[-2:] == oracle_system[-2:] == [2, 198]  # <|im_end|> "\n"
    assert system[len(oracle_system) - 2 : -2] == [builder.filler_id] * filler
    assert list(padded.token_ids[len(system) :]) == expected[len(oracle_system) :]


def test_stateless_messages_match_the_template_too(unpadded, tokenizer):
    """The stateless path (/v1's turns, build_from_turns) gives the same ids as the template, and so does a
    conversation without a system prompt once the template's default one is spelled out."""
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": USERS[0]},
        {"role": "assistant", "content": REPLIES[0]},
        {"role": "user", "content": USERS[1]},
    ]
    assert list(unpadded.build_from_turns(v1_turns(messages)).token_ids) == oracle(tokenizer, messages)
    default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    without_system = messages[1:]
    plan = unpadded.build_from_turns(v1_turns([{"role": "system", "content": default},
                                              *without_system]))
    assert list(plan.token_ids) == oracle(tokenizer, without_system)


@pytest.mark.parametrize(
    "reply_ids, why",
    [
        (
            [19556, 198, 198],
            '"Hello" then "\\n"+"\\n": the text "Hello\\n\\n" encodes to [19556, 1116]',
        ),
        ([11653, 5365, 28, 905, 17], '"Hel"+"lo": the text "Hello" encodes to one token'),
    ],
)
def test_a_reply_that_re_encodes_differently_keeps_its_ids(unpadded, tokenizer, reply_ids, why):
    reply_text = tokenizer.decode(reply_ids)
    assert canonical(tokenizer, reply_text) != reply_ids, why  # the drift is real

    system = unpadded.system_segment("general")
    system_text = get_preset("general").render()
    first = unpadded.build(system, [], USERS[0])
    text_turn1 = [{"role": "system", "content": system_text}, {"role": "user", "content": USERS[0]}]
    assert list(first.token_ids) == oracle(tokenizer, text_turn1)  # agreed up to here

    # What the engine holds after generating the reply: the prompt, then the generated ids.
    cached = list(first.token_ids) + reply_ids
    history = [list(first.new_user_segment), unpadded.assistant_segment(reply_ids + [2], True)]
    second = unpadded.build(system, history, USERS[1])
    assert is_strict_prefix(first.token_ids, second.token_ids)
    assert list(second.token_ids[: len(cached)]) == cached  # token level: the whole cache hits

    # Re-rendering the same conversation as text does not start with what the engine holds.
    text_turn2 = [
        *text_turn1,
        {"role": "assistant", "content": reply_text},
        {"role": "user", "content": USERS[1]},
    ]
    rerendered = oracle(tokenizer, text_turn2)
    assert rerendered[: len(cached)] != cached
    diverge = common_prefix_len(rerendered, cached)
    assert (
        len(first.token_ids) <= diverge < len(cached)
    )  # inside the reply: the cache misses from there
