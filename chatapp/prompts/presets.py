"""System-prompt presets: versioned Jinja2 files in templates/prompts/presets/.

A preset is `presets/<id>.jinja`: TOML front-matter in a leading Jinja comment (title,
description, optional `version` and `order`, `[variables]` with defaults), then the
system prompt. Its version is `<declared>-<sha>` (or just `<sha>`), sha being the first
12 hex digits of the file's sha256, so any change is a new version. A conversation keeps
the version it started with, so versions are frozen, byte for byte, into the registry
`versions/<id>/<version>.jinja` (committed with the code, no database needed) and
`get_preset(id, version)` finds them there after the file changes. A preset that fails
validation raises PresetInvalid: it cannot be used or frozen.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from jinja2 import Template, TemplateError
from jinja2.exceptions import SecurityError, UndefinedError

from chatapp.prompts.errors import PresetInvalid, PresetNotFound, PresetRenderError
from chatapp.prompts.templating import (
    Problem,
    parse_front_matter,
    sandbox_environment,
    static_problems,
)

log = logging.getLogger(__name__)

PRESET_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
VERSION_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
DECLARED_VERSION_RE = re.compile(r"^[A-Za-z0-9._]{1,16}$")
# Variable values are plain data: objects could smuggle methods (or a clock) into the sandbox.
VALUE_TYPES = (str, int, float, bool)
MAX_VALUE_CHARS = 4000


# Where the templates live when Django is not configured (scripts, the engine's tools).
DEFAULT_TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates" / "prompts"


def setting(name: str, default: Any) -> Any:
    """Django's setting `name`, or `default` where Django is not configured."""
    return getattr(settings, name, default) if settings.configured else default


def templates_dir() -> Path:
    """The prompt templates folder: settings.PROMPT_TEMPLATES_DIR."""
    return Path(setting("PROMPT_TEMPLATES_DIR", DEFAULT_TEMPLATES_DIR))


def presets_dir() -> Path:
    return templates_dir() / "presets"


def versions_dir() -> Path:
    return templates_dir() / "versions"


@dataclass(frozen=True)
class Preset:
    id: str
    version: str
    title: str
    description: str
    variables: tuple[str, ...]  # every variable the template may use
    defaults: Mapping[str, object] = field(compare=False)
    required: tuple[str, ...] = ()  # variables without a default: the caller must give them
    order: int = 100  # list position (front-matter `order`); the first is the default choice
    source: str = field(default="", repr=False)
    path: Path | None = field(default=None, compare=False)

    @property
    def ref(self) -> str:
        return f"{self.id}@{self.version}"

    def values(self, variables: Mapping[str, object] | None = None) -> dict[str, object]:
        """Defaults overlaid with `variables`, checked: known names, plain values, none missing."""
        given = dict(variables or {})
        unknown = sorted(set(given) - set(self.variables))
        if unknown:
            raise PresetRenderError(
                f"preset {self.id!r} has no variable {unknown[0]!r} "
                f"(its variables: {', '.join(self.variables) or 'none'})"
            )
        for name, value in given.items():
            if not isinstance(value, VALUE_TYPES):
                raise PresetRenderError(
                    f"variable {name!r} of preset {self.id!r} must be text or a number, "
                    f"not {type(value).__name__}"
                )
            if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
                raise PresetRenderError(
                    f"variable {name!r} is longer than {MAX_VALUE_CHARS} characters"
                )
        values = {**self.defaults, **given}
        missing = [name for name in self.required if name not in values]
        if missing:
            raise PresetRenderError(f"preset {self.id!r} needs a value for {missing[0]!r}")
        return values

    def render(self, variables: Mapping[str, object] | None = None) -> str:
        """The system prompt text. Leading/trailing whitespace is dropped so edits there
        cannot silently create a new token sequence."""
        values = self.values(variables)
        try:
            return _compiled(self.source).render(**values).strip()
        except SecurityError as exc:
            raise PresetRenderError(f"preset {self.ref}: sandbox violation: {exc}") from exc
        except UndefinedError as exc:
            raise PresetRenderError(f"preset {self.ref}: {exc}") from exc
        except (TemplateError, ArithmeticError, LookupError, TypeError, ValueError) as exc:
            # Runtime errors inside the template ({{ 1 + "a" }}, {{ [][0] }}) are its fault.
            raise PresetRenderError(f"preset {self.ref}: {type(exc).__name__}: {exc}") from exc


@functools.lru_cache(maxsize=256)
def _compiled(source: str) -> Template:
    return sandbox_environment("preset").from_string(source)


def content_version(source: str, declared: str | None) -> str:
    sha = hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]
    return f"{declared}-{sha}" if declared else sha


def read_variables(meta: dict) -> tuple[dict, tuple[str, ...], list[Problem]]:
    """Front-matter [variables]: `name = "default"` or `name = {default=..., description=...}`
    (the description documents the template; nothing reads it)."""
    defaults: dict[str, object] = {}
    required: list[str] = []
    problems: list[Problem] = []
    table = meta.get("variables", {})
    if not isinstance(table, dict):
        return {}, (), [Problem("front-matter", "[variables] must be a table")]
    for name, spec in table.items():
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
            problems.append(Problem("front-matter", f"variable name {name!r} is not an identifier"))
            continue
        if isinstance(spec, dict) and "default" not in spec:
            required.append(name)
            continue
        defaults[name] = spec["default"] if isinstance(spec, dict) else spec
        if not isinstance(defaults[name], VALUE_TYPES):
            problems.append(
                Problem("front-matter", f"default of {name!r} must be text or a number")
            )
    return defaults, tuple(required), problems


def parse_preset(
    preset_id: str, source: str, path: Path | None = None
) -> tuple[Preset | None, list[Problem]]:
    """Validate a preset's source without rendering it; returns (preset or None, problems)."""
    fm = parse_front_matter(source)
    if fm.error:
        return None, [Problem("front-matter", fm.error)]
    if fm.kind == "format":
        return None, [Problem("front-matter", "this file is a chat format, not a preset")]
    meta = fm.meta
    problems: list[Problem] = []
    declared = meta.get("version")
    if declared is not None:
        declared = str(declared)
        if not DECLARED_VERSION_RE.fullmatch(declared):
            problems.append(
                Problem("front-matter", f"version {declared!r}: use letters, digits, '.' or '_'")
            )
    defaults, required, var_problems = read_variables(meta)
    problems += var_problems
    names = frozenset(defaults) | frozenset(required)
    problems += static_problems(source, "preset", names)
    if problems:
        return None, problems
    preset = Preset(
        id=preset_id,
        version=content_version(source, declared),
        title=str(meta.get("title", preset_id)),
        description=str(meta.get("description", "")),
        variables=tuple(sorted(names)),
        defaults=defaults,
        required=required,
        order=int(meta.get("order", 100)) if isinstance(meta.get("order", 100), int) else 100,
        source=source,
        path=path,
    )
    return preset, []


@functools.lru_cache(maxsize=256)
def _load(preset_id: str, source: str, path: str) -> Preset:
    preset, problems = parse_preset(preset_id, source, Path(path))
    if preset is None:
        raise PresetInvalid(
            f"preset {preset_id!r} ({path}) is invalid and cannot be used: "
            + "; ".join(str(p) for p in problems)
        )
    return preset


def _check_id(preset_id: str) -> None:
    # Ids become file names: refuse anything that could walk out of the folder.
    if not isinstance(preset_id, str) or not PRESET_ID_RE.fullmatch(preset_id):
        raise PresetNotFound(f"no preset {preset_id!r}")


def load_preset_file(path: Path | str, preset_id: str | None = None) -> Preset:
    path = Path(path)
    return _load(preset_id or path.stem, path.read_text(encoding="utf-8"), str(path))


def get_preset(preset_id: str, version: str | None = None) -> Preset:
    """The preset `preset_id`: its current version, or the named (possibly older) one."""
    _check_id(preset_id)
    if version is not None and (not isinstance(version, str) or not VERSION_RE.fullmatch(version)):
        raise PresetNotFound(f"preset {preset_id!r} has no version {version!r}")
    current = presets_dir() / f"{preset_id}.jinja"
    if version is None:
        if not current.is_file():
            raise PresetNotFound(f"no preset {preset_id!r}")
        return load_preset_file(current, preset_id)
    if current.is_file():
        source = current.read_text(encoding="utf-8")
        declared = parse_front_matter(source).meta.get("version")  # {} when unreadable
        if content_version(source, str(declared) if declared is not None else None) == version:
            return _load(preset_id, source, str(current))
    frozen = versions_dir() / preset_id / f"{version}.jinja"
    if not frozen.is_file():
        raise PresetNotFound(f"preset {preset_id!r} has no version {version!r}")
    preset = load_preset_file(frozen, preset_id)
    if preset.version != version:  # the registry file was edited: refuse a silent change
        raise PresetInvalid(f"version registry entry {frozen} does not match its version")
    return preset


def list_presets() -> list[Preset]:
    """Current versions of the presets that pass validation, by `order` then id (invalid
    ones are logged, not listed)."""
    result = []
    for path in sorted(presets_dir().glob("*.jinja")):
        if not PRESET_ID_RE.fullmatch(path.stem):
            log.warning("preset file %s: name is not a valid preset id", path)
            continue
        try:
            result.append(load_preset_file(path))
        except PresetInvalid as exc:
            log.warning("%s", exc)
    return sorted(result, key=lambda p: (p.order, p.id))


def list_versions(preset_id: str) -> list[str]:
    """Versions of `preset_id` in the registry (activated versions), sorted by name."""
    _check_id(preset_id)
    return sorted(p.stem for p in (versions_dir() / preset_id).glob("*.jinja"))


def is_frozen(preset: Preset) -> bool:
    return (versions_dir() / preset.id / f"{preset.version}.jinja").is_file()


def freeze_preset(preset: Preset) -> Path:
    """Copy a (linted) preset into the version registry; idempotent, never overwrites."""
    dest = versions_dir() / preset.id / f"{preset.version}.jinja"
    if dest.exists():
        if dest.read_text(encoding="utf-8") != preset.source:
            raise PresetInvalid(f"{dest} exists with different content")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(preset.source, encoding="utf-8")
    return dest
