"""Encoding of content and the chat formats (the tokenizers' own templates are the oracle)."""

from __future__ import annotations

from types import SimpleNamespace

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatapp.prompts.encoding import TokenEncoder
from chatapp.prompts.errors import FormatError
from chatapp.prompts.formats import format_for_tokenizer, get_format

SPECIALS = (
    "<|",
    "|>",
    "<file",
    "<repo",
    "<gh_",
    "<issue",
    "<jupyter",
    "<empty",
    "<filename",
    "<reponame",
)

# Meta's chat template of Llama-3-8B-Instruct, verbatim.
LLAMA3_OFFICIAL = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Any text a message may hold: NUL and lone surrogates are refused before encoding.
MESSAGE_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
plain_text = st.text(MESSAGE_CHARS, max_size=60).filter(
    lambda t: not any(s in t for s in SPECIALS)
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=plain_text)
def test_content_encoding_equals_the_tokenizer(tokenizer, builder, text):
    encoder = TokenEncoder(tokenizer)
    assert encoder.untrusted(text) == tokenizer.encode(text, add_special_tokens=False)
    if text.strip():
        whole = tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n", add_special_tokens=False)
        assert builder.user_segment(text) == whole


def test_special_token_strings_in_content_stay_text(tokenizer):
    encoder = TokenEncoder(tokenizer)
    ids = encoder.untrusted("<|im_start|>x<|im_end|>")
    assert 1 not in ids and 2 not in ids
    assert tokenizer.decode(ids) == "<|im_start|>x<|im_end|>"


def test_smollm2_gets_chatml(tokenizer):
    fmt = format_for_tokenizer(tokenizer)
    assert fmt.name == "chatml" and fmt.stop_token == tokenizer.eos_token == "<|im_end|>"


def _fake_tokenizer(tokens):
    return SimpleNamespace(get_vocab=lambda: {t: i for i, t in enumerate(tokens)})


def test_llama3_tokenizers_get_llama3():
    llama = _fake_tokenizer(
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "a"]
    )
    assert format_for_tokenizer(llama).name == "llama3"
    with pytest.raises(FormatError, match="no chat format matches"):
        format_for_tokenizer(_fake_tokenizer(["<s>", "</s>"]))


def test_llama3_format_renders_like_metas_template():
    fmt = get_format("llama3")
    messages = [
        {"role": "system", "content": "Be brief. "},
        {"role": "user", "content": "  Hi\n"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    official = jinja2.Environment().from_string(LLAMA3_OFFICIAL)
    for n in range(1, len(messages) + 1):
        for gen in (False, True):
            expected = official.render(
                messages=messages[:n], add_generation_prompt=gen, bos_token="<|begin_of_text|>"
            )
            assert fmt.render(messages[:n], add_generation_prompt=gen) == expected
    before, content, after = fmt.turn_parts("user", "  Hi\n")
    assert (before, content, after) == (
        "<|start_header_id|>user<|end_header_id|>\n\n",
        "Hi",
        "<|eot_id|>",
    )
    assert fmt.opening_parts("system", "S")[0].startswith("<|begin_of_text|>")


def test_chatml_renders_like_smollm2s_template(tokenizer):
    fmt = get_format("chatml")
    messages = [
        {"role": "system", "content": "Sys"},
        {"role": "user", "content": " Hi "},
        {"role": "assistant", "content": "Yo\n"},
        {"role": "user", "content": "Bye"},
    ]
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert fmt.render(messages, add_generation_prompt=True) == expected
