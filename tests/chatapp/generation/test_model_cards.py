"""A served model's kind, read from its own file without loading it: a Hugging Face
folder with a chat template (beside it, or in tokenizer_config.json) is a chat model, one
without is a base model, served for completions only, unless LLM_FORCE_CHAT_TEMPLATE
names it (by alias, by its own name, or "*")."""

from __future__ import annotations

import json

import pytest

from chatapp.chat.errors import InvalidInput
from chatapp.generation import model_cards
from inference.model_file import has_chat_template


def folder(tmp_path, name: str, template: str | None = None, in_config: bool = False):
    """A model folder as far as its kind goes: a config and a tokenizer config."""
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text("{}")
    config = {"chat_template": template} if template and in_config else {}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if template and not in_config:
        (path / "chat_template.jinja").write_text(template)
    return path


@pytest.fixture
def served(tmp_path, settings):
    settings.LLM_MODELS = ",".join([
        f"chat={folder(tmp_path, 'with-file', '{{ messages }}')}",
        f"inline={folder(tmp_path, 'in-config', '{{ messages }}', in_config=True)}",
        f"base={folder(tmp_path, 'no-template')}",
    ])
    settings.LLM_FORCE_CHAT_TEMPLATE = []
    return settings


def test_a_folder_says_whether_it_carries_a_chat_template(tmp_path):
    assert has_chat_template(str(folder(tmp_path, "a", "{{ x }}")))
    assert has_chat_template(str(folder(tmp_path, "b", "{{ x }}", in_config=True)))
    assert not has_chat_template(str(folder(tmp_path, "c")))


def test_a_model_without_a_template_is_a_completion_model(served):
    assert [model_cards.kind(a) for a in ("chat", "inline", "base")] == [
        "chat", "chat", "completion"]
    assert model_cards.chat_aliases() == ["chat", "inline"]
    with pytest.raises(InvalidInput) as err:
        model_cards.conversation_model("base")
    assert err.value.code == "model_not_chat"
    assert model_cards.conversation_model("inline") == "inline"


@pytest.mark.parametrize("named", ["base", "no-template", "*"])
def test_the_operator_can_serve_a_base_model_as_a_chat_model(served, named):
    served.LLM_FORCE_CHAT_TEMPLATE = [named]
    assert model_cards.kind("base") == "chat"
    assert model_cards.chat_aliases() == ["chat", "inline", "base"]


def test_the_packaged_gemma_is_a_base_model(settings):
    from inference.loader import gemma3_gguf_path

    if gemma3_gguf_path() is None:
        pytest.skip("needs the Gemma 3 GGUF: make install-gemma3")
    settings.LLM_MODELS = "smollm2=smollm2-135m-instruct,gemma=gemma3-270m"
    settings.LLM_FORCE_CHAT_TEMPLATE = []
    assert model_cards.kind("smollm2") == "chat"
    assert model_cards.kind("gemma") == model_cards.kind("gemma3-270m") == "completion"
