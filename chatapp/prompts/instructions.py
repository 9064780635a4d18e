"""Instructions: the fixed requests the service itself sends as a user turn after a
conversation's own prompt (`templates/prompts/instructions/<name>.jinja`), such as the
history summary's and the title's. Each renders in the sandbox from its declared
variables alone, so it is the same tokens every time and `prompts lint` can prove it."""

from __future__ import annotations

import functools
from pathlib import Path

from jinja2 import TemplateError

from chatapp.prompts.errors import PromptError
from chatapp.prompts.presets import templates_dir
from chatapp.prompts.templating import parse_front_matter, sandbox_environment


def instructions_dir() -> Path:
    return templates_dir() / "instructions"


def instruction_path(name: str) -> Path:
    return instructions_dir() / f"{name}.jinja"


def instruction_paths() -> list[Path]:
    """Every shipped instruction."""
    return sorted(instructions_dir().glob("*.jinja"))


@functools.lru_cache(maxsize=16)
def _render(name: str, source: str, values: tuple) -> str:
    where = instruction_path(name)
    fm = parse_front_matter(source)
    if fm.kind != "instruction" or fm.error:
        raise PromptError(f"{where}: missing or invalid '{{#- instruction ... #}}' front-matter")
    try:
        text = sandbox_environment("preset").from_string(source).render(**dict(values))
    except TemplateError as exc:
        raise PromptError(f"{where}: {exc}") from exc
    if not text.strip():
        raise PromptError(f"{where}: the request renders no text")
    return text.strip()


def render_instruction(name: str, source: str | None = None, **values: object) -> str:
    """The text of instruction `name` (or of `source`, its text being checked) rendered
    with `values`. PromptError when it has no valid front-matter, fails or renders blank."""
    if source is None:
        source = instruction_path(name).read_text(encoding="utf-8")
    return _render(name, source, tuple(sorted(values.items())))
