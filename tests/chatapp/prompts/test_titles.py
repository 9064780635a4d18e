"""How what the model wrote becomes a conversation's title."""

from __future__ import annotations

import pytest

from chatapp.prompts.titles import MAX_WORDS, request_text, title_from


@pytest.mark.parametrize("written, title", [
    ('"Mixing blue and yellow paint".\n\nThe answer is green.', "Mixing blue and yellow paint"),
    ("Title: Paint colours", "Paint colours"),
    ("\n\n  **Green from blue and yellow**  ", "Green from blue and yellow"),
    ("In the realm of art, where imagination meets reality, the answer lies",
     "In the realm of art, where imagination meets"),
    ("  \n \x00 ", ""),
])
def test_the_title_is_the_first_line_without_its_wrapping(written, title):
    assert title_from(written, 200) == title


def test_a_title_keeps_to_its_characters_at_a_word():
    assert title_from("Prefix caches explained", 14) == "Prefix caches"


def test_the_request_asks_for_a_few_words():
    text = request_text()
    assert f"at most {MAX_WORDS} words" in text and text == request_text()
