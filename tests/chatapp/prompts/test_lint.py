"""Acceptance 4: `prompts lint` passes on the shipped templates and fails, naming the
cause, on templates that use a clock, a random value, an unknown variable, a sandbox
escape, and on a chat format that rewrites history. Broken presets cannot be activated."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command, execute_from_command_line
from django.core.management.base import CommandError

from chatapp.prompts import lint, presets
from chatapp.prompts.errors import PresetInvalid, PromptError
from chatapp.prompts.services import PromptBuilder
from tests.chatapp.prompts.conftest import BAD_TEMPLATES

REPO = Path(__file__).resolve().parents[3]


def test_shipped_templates_pass(tokenizer):
    results = lint.lint_paths(tokenizer=tokenizer)
    kinds = {r.kind for r in results}
    assert kinds == {"preset", "format", "marker", "instruction"}
    assert len(results) >= 8
    for result in results:
        assert result.ok, result.render_text()
    support = next(r for r in results if r.name.startswith("support@"))
    assert any("blocks of 16" in note for note in support.notes)
    assert any("every prompt extends the previous one" in note for note in support.notes)


def test_the_history_markers_are_linted_in_every_format(tokenizer):
    markers = {r.name: r for r in lint.lint_paths(tokenizer=tokenizer) if r.kind == "marker"}
    assert set(markers) == {"history_cut", "history_summary"}
    for marker in markers.values():
        assert marker.ok, marker.render_text()
        assert sum("extending its prompt between cuts" in note for note in marker.notes) == 4
    assert all("summary segment" in note for note in markers["history_summary"].notes)


def test_a_summary_marker_takes_the_summary_alone(tokenizer, tmp_path):
    head = '{#- marker\ntitle = "t"\n[variables]\nsummary = "s"\nlanguage = "en"\n-#}\n'
    path = tmp_path / "markers" / "history_summary.jinja"
    path.parent.mkdir()
    path.write_text(head + "Summary ({{ language }}): {{ summary }}\n")
    result = lint.lint_file(path, tokenizer=tokenizer)
    assert any(p.code == "unknown-variable" and "language" in p.message
               for p in result.problems), result.render_text()
    path.write_text('{#- marker\ntitle = "t"\n[variables]\nsummary = "s"\n-#}\n'
                    "Summary of {{ now() }}: {{ summary }}\n")
    result = lint.lint_file(path, tokenizer=tokenizer)
    assert any(p.code == "clock" for p in result.problems), result.render_text()


def test_the_summary_and_title_requests_are_linted_as_instructions(tokenizer, tmp_path):
    requests = {r.name: r for r in lint.lint_paths(tokenizer=tokenizer) if r.kind == "instruction"}
    assert set(requests) == {"summarise_history", "title_conversation"}
    for request in requests.values():
        assert request.ok, request.render_text()
    path = tmp_path / "instructions" / "summarise_history.jinja"
    path.parent.mkdir()
    path.write_text('{#- instruction\ntitle = "t"\n[variables]\nmax_words = 1\n-#}\n'
                    "Summarise in {{ max_words }} words, as of {{ now() }}.\n")
    result = lint.lint_file(path, tokenizer=tokenizer)
    assert not result.ok and result.kind == "instruction"
    assert any(p.code == "clock" for p in result.problems), result.render_text()


def test_a_marker_that_reads_the_clock_or_a_variable_fails(tokenizer, tmp_path):
    head = '{#- marker\ntitle = "t"\n-#}\n'
    clock = tmp_path / "markers" / "clock.jinja"
    clock.parent.mkdir()
    clock.write_text(head + "Turns before {{ now() }} were left out.\n")
    result = lint.lint_file(clock, tokenizer=tokenizer)
    assert not result.ok and result.kind == "marker"
    assert any(p.code == "clock" for p in result.problems), result.render_text()
    variable = tmp_path / "markers" / "variable.jinja"
    variable.write_text(head + "{{ user_name }}'s earlier turns were left out.\n")
    result = lint.lint_file(variable, tokenizer=tokenizer)
    assert any(p.code == "unknown-variable" for p in result.problems), result.render_text()


def test_lint_command_passes_on_shipped_templates(command_tokenizer, capsys):
    call_command("prompts", "lint")
    out = capsys.readouterr().out
    assert "templates ok" in out and "FAIL" not in out


@pytest.mark.parametrize(
    "name, code, words",
    [
        ("clock.jinja", "clock", ["uses a clock ('now')"]),
        ("random_value.jinja", "random", ["uses a random value (filter 'random')"]),
        ("unknown_variable.jinja", "unknown-variable", ["unknown variable 'company'"]),
        ("sandbox_escape.jinja", "sandbox", ["sandbox violation", "'__class__'"]),
        ("syntax_error.jinja", "syntax", ["syntax error at line 4"]),
        ("rewrites_history.jinja", "history", ["rewrites history", "first divergence at token"]),
        ("rewrites_tool_calls.jinja", "history", ["rewrites history in a tool loop"]),
    ],
)
def test_bad_template_fails_naming_the_cause(tokenizer, name, code, words):
    (result,) = lint.lint_paths([BAD_TEMPLATES / name], tokenizer=tokenizer)
    assert not result.ok
    messages = [str(p) for p in result.problems if p.code == code]
    assert messages, result.render_text()
    for word in words:
        assert any(word in m for m in messages), result.render_text()
    assert name in result.render_text()


@pytest.mark.parametrize("name", ["clock.jinja", "random_value.jinja"])
def test_two_renders_under_different_clocks_and_seeds_diverge(tokenizer, name):
    """Beyond naming the cause, lint proves it: the token ids of two renders differ."""
    (result,) = lint.lint_paths([BAD_TEMPLATES / name], tokenizer=tokenizer)
    unstable = [str(p) for p in result.problems if p.code == "unstable"]
    assert unstable and "first divergence at token" in unstable[0]


def test_lint_command_fails_and_names_every_bad_template(command_tokenizer, capsys):
    with pytest.raises(CommandError, match="lint failed for 7 of 7"):
        call_command("prompts", "lint", str(BAD_TEMPLATES))
    out = capsys.readouterr().out
    for path in BAD_TEMPLATES.glob("*.jinja"):
        assert f"FAIL {path.relative_to(REPO)}" in out


def test_lint_exit_status_is_non_zero(command_tokenizer, capsys):
    """The command-line path CI runs (argv parsing, exit status), in this process."""
    argv = ["manage.py", "prompts", "lint", str(BAD_TEMPLATES / "clock.jinja")]
    with pytest.raises(SystemExit) as exited:
        execute_from_command_line(argv)
    assert exited.value.code != 0
    captured = capsys.readouterr()
    assert "clock.jinja" in captured.out and "uses a clock" in captured.out
    assert "lint failed" in captured.err
    execute_from_command_line(["manage.py", "prompts", "lint"])  # shipped: exits normally


@pytest.fixture
def workspace(tmp_path, settings):
    """A templates folder of our own: the shipped formats, one good preset."""
    shutil.copytree(Path(django_settings.PROMPT_TEMPLATES_DIR) / "formats", tmp_path / "formats")
    (tmp_path / "presets").mkdir()
    shutil.copy(
        Path(django_settings.PROMPT_TEMPLATES_DIR) / "presets" / "general.jinja",
        tmp_path / "presets",
    )
    settings.PROMPT_TEMPLATES_DIR = tmp_path
    return tmp_path


@pytest.mark.parametrize(
    "name", ["syntax_error", "unknown_variable", "sandbox_escape", "clock", "random_value"]
)
def test_a_broken_preset_cannot_be_activated(workspace, command_tokenizer, tokenizer, name):
    shutil.copy(BAD_TEMPLATES / f"{name}.jinja", workspace / "presets" / f"{name}.jinja")
    with pytest.raises(PresetInvalid, match=f"preset '{name}'"):
        presets.get_preset(name)
    with pytest.raises(PromptError):
        PromptBuilder(tokenizer, block_size=16).system_segment(name)
    assert name not in [p.id for p in presets.list_presets()]
    with pytest.raises(CommandError, match=f"not activated.*{name}"):
        call_command("prompts", "freeze", name)
    assert presets.list_versions(name) == []


def test_freeze_activates_a_good_preset(workspace, command_tokenizer, capsys):
    with pytest.raises(CommandError):
        call_command("prompts", "lint", str(workspace / "presets"))  # not frozen yet
    assert "not-frozen" in capsys.readouterr().out
    call_command("prompts", "freeze", "general")
    preset = presets.get_preset("general")
    assert presets.list_versions("general") == [preset.version]
    call_command("prompts", "lint", str(workspace / "presets"))
