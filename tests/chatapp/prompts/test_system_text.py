"""A user's own system prompt: the rules its text obeys (chatapp.prompts.system_text)."""

import pytest

from chatapp.prompts.errors import PromptError
from chatapp.prompts.system_text import UnstableText, check_system_text


def test_jinja_in_the_text_stays_as_written():
    text = "Reply as {{ name }} would {% if x %}politely{% endif %}."
    assert check_system_text(f"  {text}\n") == text


@pytest.mark.parametrize("text", ["Today is {{CURRENT_DATE}}.", "Now: {{ now() }}",
                                  "Pick {{ items|random }}", "{% set t = time() %}hi",
                                  "Id {{ request_id }}"])
def test_clock_random_and_request_placeholders_are_refused(text):
    with pytest.raises(UnstableText, match="sent as written"):
        check_system_text(text)


def test_the_length_limit_and_text_rules(settings):
    settings.CHAT_SYSTEM_PROMPT_MAX_CHARS = 10
    with pytest.raises(PromptError, match="the limit is 10"):
        check_system_text("x" * 11)
    with pytest.raises(PromptError, match="NUL"):
        check_system_text("a\x00b")
    with pytest.raises(PromptError, match="must be text"):
        check_system_text(3)
    assert check_system_text("   ") == ""
