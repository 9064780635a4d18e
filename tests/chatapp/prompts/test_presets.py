"""Presets: versions derived from content, old versions resolvable, variables checked."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from chatapp.prompts import presets
from chatapp.prompts.errors import PresetInvalid, PresetNotFound, PresetRenderError
from chatapp.prompts.services import PromptBuilder

V1 = """{#- preset
title = "Tiny"
description = "A test preset."
version = "1"
[variables]
name = { default = "Ada", description = "Who the assistant is" }
-#}
You are {{ name }}.
"""
V2 = V1.replace("You are {{ name }}.", "You are {{ name }}, and you are brief.")


@pytest.fixture
def workspace(tmp_path, settings):
    shutil.copytree(Path(django_settings.PROMPT_TEMPLATES_DIR) / "formats", tmp_path / "formats")
    (tmp_path / "presets").mkdir()
    settings.PROMPT_TEMPLATES_DIR = tmp_path
    return tmp_path


def test_shipped_presets_describe_themselves():
    for preset in presets.list_presets():
        assert preset.title and preset.description and preset.version
        assert presets.is_frozen(preset), f"run manage.py prompts freeze {preset.id}"
        assert presets.get_preset(preset.id, preset.version) == preset
        assert preset.render()  # defaults suffice


def test_every_registered_version_resolves():
    registry = Path(django_settings.PROMPT_TEMPLATES_DIR) / "versions"
    entries = sorted(registry.glob("*/*.jinja"))
    assert len(entries) >= 3
    for entry in entries:
        preset = presets.get_preset(entry.parent.name, entry.stem)
        assert preset.version == entry.stem and preset.render()


def test_a_changed_preset_is_a_new_version_and_the_old_one_stays(workspace, tokenizer):
    path = workspace / "presets" / "tiny.jinja"
    path.write_text(V1)
    old = presets.get_preset("tiny")
    assert old.version.startswith("1-") and old.title == "Tiny" and old.defaults == {"name": "Ada"}
    presets.freeze_preset(old)
    builder = PromptBuilder(tokenizer, block_size=16)
    old_segment = builder.system_segment("tiny")

    path.write_text(V2)  # the file changes under a running conversation
    new = presets.get_preset("tiny")
    assert new.version != old.version
    assert new.render() == "You are Ada, and you are brief."
    again = presets.get_preset("tiny", old.version)
    assert again.version == old.version and again.render() == "You are Ada."
    assert builder.system_segment("tiny", old.version) == old_segment
    assert builder.system_segment("tiny") != old_segment
    assert presets.list_versions("tiny") == [old.version]


def test_unknown_presets_and_versions(workspace):
    (workspace / "presets" / "tiny.jinja").write_text(V1)
    with pytest.raises(PresetNotFound):
        presets.get_preset("nope")
    with pytest.raises(PresetNotFound, match="no version"):
        presets.get_preset("tiny", "1-000000000000")
    for bad in ("../presets/tiny", "Tiny", "", "a/b"):
        with pytest.raises(PresetNotFound):
            presets.get_preset(bad)
    with pytest.raises(PresetNotFound):
        presets.get_preset("tiny", "../../etc/passwd")


def test_a_tampered_registry_entry_is_refused(workspace):
    path = workspace / "presets" / "tiny.jinja"
    path.write_text(V1)
    old = presets.get_preset("tiny")
    frozen = presets.freeze_preset(old)
    path.write_text(V2)
    frozen.write_text(V1.replace("Ada", "Eve"))
    with pytest.raises(PresetInvalid, match="does not match"):
        presets.get_preset("tiny", old.version)


def test_variables_are_checked(workspace):
    (workspace / "presets" / "tiny.jinja").write_text(V1)
    preset = presets.get_preset("tiny")
    assert preset.render({"name": "Grace"}) == "You are Grace."
    with pytest.raises(PresetRenderError, match="no variable 'nmae'"):
        preset.render({"nmae": "Grace"})
    with pytest.raises(PresetRenderError, match="text or a number"):
        preset.render({"name": object()})


def test_required_variable_without_default(workspace):
    (workspace / "presets" / "brand.jinja").write_text(
        '{#- preset\n[variables]\nbrand = { description = "no default" }\n-#}\nYou sell {{ brand }}.\n'
    )
    preset = presets.get_preset("brand")
    assert preset.required == ("brand",)
    with pytest.raises(PresetRenderError, match="needs a value for 'brand'"):
        preset.render()
    assert preset.render({"brand": "Acme"}) == "You sell Acme."


def test_time_named_variables_are_refused(workspace):
    (workspace / "presets" / "dated.jinja").write_text(
        '{#- preset\n[variables]\ncurrent_date = "2024-01-01"\n-#}\nToday is {{ current_date }}.\n'
    )
    with pytest.raises(PresetInvalid, match="uses a clock"):
        presets.get_preset("dated")


def test_templates_get_no_clock_random_or_request_values(workspace):
    """The sandbox offers none: Jinja's own `random` filter and `lipsum` are removed too."""
    from chatapp.prompts.templating import sandbox_environment

    env = sandbox_environment()
    assert "random" not in env.filters and "lipsum" not in env.globals
    assert not {"now", "time", "datetime", "random", "request_id", "uuid4"} & set(env.globals)
