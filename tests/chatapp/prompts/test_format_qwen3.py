"""Qwen3's chat format: thinking off, and the empty think block kept on every assistant
turn, so each prompt extends the last token for token (Qwen's own template drops it from
earlier turns: QwenLM/Qwen3 #1826). The tokenizer is a byte-level BPE vocabulary with
ChatML's tokens and Qwen3's <think> tags added as Qwen3 has them (not special)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chatapp.prompts import lint, tools
from chatapp.prompts.formats import format_for_tokenizer, formats_dir, get_format
from chatapp.prompts.services import PromptBuilder
from tests.chatapp.prompts.conftest import common_prefix_len, is_strict_prefix, tokenizer_with

BLOCK = 16
EMPTY_THINK = "<think>\n\n</think>\n\n"
USERS = ["Hello!", "What is a prime number?", "Give me two examples.", "Thanks, bye."]
REPLIES = ["Hi! How can I help?", "A number with exactly two divisors.", "2 and 3.", "Bye!"]


@pytest.fixture(scope="module")
def qwen_like():
    return tokenizer_with(added=("<think>", "</think>", "<tool_call>", "</tool_call>"))


@pytest.fixture(scope="module")
def builder(qwen_like) -> PromptBuilder:
    return PromptBuilder(qwen_like, block_size=BLOCK)


def qwen_vendor_history(messages: list[dict]) -> str:
    """The text Qwen's own template gives with thinking off: the generation prompt ends
    with an empty think block, but assistant turns before the last user message are
    written without one."""
    out = "".join(
        f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return out + "<|im_start|>assistant\n" + EMPTY_THINK


def conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": USERS[turn]})
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": REPLIES[turn]})
    return messages


def test_a_tokenizer_with_think_tags_gets_qwen3(tokenizer, qwen_like):
    assert format_for_tokenizer(qwen_like).name == "qwen3"
    assert format_for_tokenizer(tokenizer).name == "chatml"  # SmolLM2: no think tags
    fake = SimpleNamespace(get_vocab=lambda: dict.fromkeys(
        ["<|im_start|>", "<|im_end|>", "<think>", "</think>"], 0))
    assert format_for_tokenizer(fake).name == "qwen3"
    assert tools.convention_for(get_format("qwen3")).name == "hermes"


def test_every_assistant_turn_carries_the_generation_prompts_think_block():
    fmt = get_format("qwen3")
    assert fmt.generation_prompt_text == "<|im_start|>assistant\n" + EMPTY_THINK
    assert fmt.turn_parts("assistant", "Hi") == (
        "<|im_start|>assistant\n" + EMPTY_THINK, "Hi", "<|im_end|>\n")
    # A reply with reasoning in it is kept as it was generated, never stripped.
    assert fmt.turn_parts("assistant", "<think>x</think>Hi")[1] == "<think>x</think>Hi"
    assert fmt.turn_parts("user", "Hi") == ("<|im_start|>user\n", "Hi", "<|im_end|>\n")


def test_the_vendor_history_stops_extending_ours_does_not():
    fmt = get_format("qwen3")
    for turn in range(1, 4):
        before, after = conversation(turn), conversation(turn + 1)
        held = fmt.render(before, add_generation_prompt=True) + REPLIES[turn - 1]
        assert fmt.render(after, add_generation_prompt=True).startswith(held)
        vendor_held = qwen_vendor_history(before) + REPLIES[turn - 1]
        vendor_next = qwen_vendor_history(after)
        # Qwen's: the last reply's think block is gone from the next prompt, so the
        # cache misses from there on, the reply included, every turn.
        assert not vendor_next.startswith(vendor_held)
        dropped_at = len(vendor_held) - len(REPLIES[turn - 1]) - len(EMPTY_THINK)
        assert common_prefix_len(vendor_held, vendor_next) == dropped_at


def test_four_turns_each_extend_the_last_token_for_token(builder):
    enc = builder.encoder
    system = builder.system_segment("general")
    assert len(system) % BLOCK == 0
    think = enc.trusted(EMPTY_THINK)
    assert builder.generation_prompt()[-len(think):] == think
    history, previous = [], None
    for turn in range(4):
        plan = builder.build(system, history, USERS[turn])
        if previous is not None:
            assert is_strict_prefix(previous, plan.token_ids)
        # Every other reply in pieces no re-encoding would produce: kept as generated.
        text = REPLIES[turn]
        generated = (enc.untrusted(text) if turn % 2 == 0
                     else [t for ch in text for t in enc.untrusted(ch)])
        generated += builder.stop_token_ids
        held = list(plan.token_ids) + generated
        history += [list(plan.new_user_segment), builder.assistant_segment(generated, True)]
        previous = tuple(held)
    final = builder.build(system, history, "One more?")
    assert final.token_ids[: len(previous)] == previous
    assert list(final.token_ids).count(enc.trusted("<think>")[0]) == 5  # 4 turns + the prompt


def test_a_shared_preset_gives_the_same_whole_blocks(builder):
    system = builder.system_segment("support")
    a = builder.build(system, [], "Hi there")
    b = builder.build(system, [], "Tell me a joke about databases")
    assert len(system) % BLOCK == 0
    assert a.shared_prefix_len == b.shared_prefix_len == len(system)
    assert a.token_ids[: len(system)] == b.token_ids[: len(system)] == tuple(system)
    assert common_prefix_len(a.token_ids, b.token_ids) // BLOCK * BLOCK == len(system)


def test_stateless_history_from_text_matches_the_chat_path(builder):
    """A client sending the replies back as text gets the same prompt: the think block
    is the format's, not the reply's."""
    system = builder.system_segment_for_text("You are terse.")
    history = []
    for turn in range(3):
        plan = builder.build(system, history, USERS[turn])
        generated = builder.encoder.untrusted(REPLIES[turn]) + builder.stop_token_ids
        history += [list(plan.new_user_segment), builder.assistant_segment(generated, True)]
    chat = builder.build(system, history, USERS[3])
    turns = [(m["role"], m["content"]) for m in conversation(4)]
    assert builder.build_from_turns(turns).token_ids == chat.token_ids


def test_lint_proves_qwen3_at_token_level(qwen_like):
    (result,) = lint.lint_paths([formats_dir() / "qwen3.jinja"], tokenizer=qwen_like)
    assert result.ok, result.render_text()
    assert any(note.startswith("token level:") for note in result.notes), result.render_text()
    # The shipped presets lint in Qwen3's format with this tokenizer, too.
    for preset in lint.lint_paths([formats_dir().parent / "presets"], tokenizer=qwen_like):
        assert preset.ok, preset.render_text()
        assert any("format qwen3" in note for note in preset.notes)


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_hermes_tool_calls_render_parse_and_extend(builder):
    hermes = tools.convention_for(builder.chat_format)
    call = hermes.call_text("get_weather", {"city": "Paris"})
    assert hermes.parse_calls(call, ["get_weather"]) == (
        "", [tools.ParsedCall("get_weather", {"city": "Paris"})])
    # The model's own ids for the call: the <tool_call> tag as its one token.
    generated = {call: builder.encoder.trusted(call) + builder.stop_token_ids}
    system = hermes.system_with_tools("Be brief.", [WEATHER])
    turns = [("system", system), ("user", "Weather in Paris?")]
    first = builder.build_from_turns(turns)
    assert first.shared_prefix_len == len(builder.system_segment_for_text(system))
    turns += [("assistant", call), (hermes.result_role, hermes.response_text('{"t": 18}'))]
    second = builder.build_from_turns(turns, assistant_ids_lookup=generated.get)
    held = list(first.token_ids) + generated[call]
    assert list(second.token_ids[: len(held)]) == held
