"""Jinja2 for prompt templates: the sandbox, the front-matter, and static safety checks.

Presets and chat formats begin with TOML metadata in a leading Jinja comment
(`{#- preset ... -#}` or `{#- format ... -#}`). Nothing that changes between renders (a
clock, a random generator, a request id) is available in the sandbox: a prompt that
changes between turns would defeat the prefix cache. The static checks here name the
cause when a template reaches for one anyway; `lint` also renders twice to prove it.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, meta, nodes
from jinja2.exceptions import TemplateAssertionError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Names that carry time, randomness or request identity. A template that names one
# (as a variable, a global or a filter) is unstable by construction.
CLOCK_NAMES = frozenset(
    {
        "now",
        "utcnow",
        "today",
        "time",
        "datetime",
        "date",
        "timestamp",
        "clock",
        "strftime_now",
        "strftime",
        "current_time",
        "current_date",
        "localtime",
        "date_string",
        "datetimeformat",
    }
)
RANDOM_NAMES = frozenset(
    {
        "random",
        "randint",
        "randrange",
        "choice",
        "shuffle",
        "uuid",
        "uuid4",
        "seed",
        "nonce",
        "lipsum",
    }
)
REQUEST_NAMES = frozenset(
    {
        "request",
        "request_id",
        "session",
        "session_id",
        "trace_id",
        "message_id",
        "conversation_id",
        "user_id",
        "csrf_token",
    }
)

# The variables a chat format receives: the Hugging Face chat-template contract.
FORMAT_VARIABLES = frozenset(
    {"messages", "add_generation_prompt", "bos_token", "eos_token", "raise_exception"}
)

_FRONT_MATTER = re.compile(r"\A\s*\{#-?\s*(preset|format|marker|instruction)\b[^\n]*\n(.*?)-?#\}", re.DOTALL)


@dataclass(frozen=True)
class Problem:
    """One finding about a template. `code` is a stable keyword; `message` says why."""

    code: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"[{self.code}] {where}{self.message}"


@dataclass
class FrontMatter:
    kind: str | None  # "preset", "format", "marker", "instruction", or None: the file has none
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def parse_front_matter(source: str) -> FrontMatter:
    match = _FRONT_MATTER.match(source)
    if match is None:
        return FrontMatter(kind=None)
    kind, body = match.group(1), match.group(2)
    try:
        return FrontMatter(kind=kind, meta=tomllib.loads(body))
    except tomllib.TOMLDecodeError as exc:
        return FrontMatter(kind=kind, error=f"front-matter is not valid TOML: {exc}")


def _raise_exception(message: str) -> None:
    # Hugging Face chat templates call raise_exception() to refuse a conversation.
    from chatapp.prompts.errors import FormatError

    raise FormatError(str(message))


def sandbox_environment(kind: str = "preset") -> ImmutableSandboxedEnvironment:
    """The environment templates render in, in production and in tests: immutable sandbox,
    strict undefined (a missing variable is an error, never an empty string), and no `random`
    filter or `lipsum`, Jinja's own sources of randomness."""
    env = ImmutableSandboxedEnvironment(
        undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, autoescape=False
    )
    env.filters.pop("random", None)
    env.globals.pop("lipsum", None)
    if kind == "format":
        env.globals["raise_exception"] = _raise_exception
    return env


def describe_jinja_error(exc: Exception) -> str:
    if isinstance(exc, TemplateSyntaxError) and not isinstance(exc, TemplateAssertionError):
        return f"syntax error at line {exc.lineno}: {exc.message}"
    if isinstance(exc, TemplateAssertionError):
        return f"template error at line {exc.lineno}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


_CATEGORIES = {"clock": CLOCK_NAMES, "random": RANDOM_NAMES, "request": REQUEST_NAMES}


def unstable_category(name: str) -> str | None:
    """The cause of instability `name` carries ("clock", "random", "request"), or None."""
    return next((cat for cat, names in _CATEGORIES.items() if name.lower() in names), None)


_CATEGORY_TEXT = {
    "clock": "uses a clock ({what}): the prompt would change with the time",
    "random": "uses a random value ({what}): the prompt would change on every render",
    "request": "uses a request-specific value ({what}): the prompt would differ per request",
}


def static_problems(
    source: str, kind: str, declared: frozenset[str] | set[str] = frozenset()
) -> list[Problem]:
    """Problems visible without rendering: syntax, unstable names, unknown variables, escapes.

    `declared` are the variables a preset declares in its front-matter; for a chat
    format the Hugging Face contract (messages, add_generation_prompt, ...) applies.
    """
    # Analysis tolerates the unstable filters: they are reported by their cause below,
    # not as "no filter named ...".
    analysis_env = sandbox_environment(kind)
    for name in CLOCK_NAMES | RANDOM_NAMES | {"shuffle"}:
        analysis_env.filters.setdefault(name, _absent_filter)
    try:
        ast = analysis_env.parse(source)
    except TemplateSyntaxError as exc:
        return [Problem("syntax", describe_jinja_error(exc), exc.lineno)]

    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()

    def add(code: str, message: str, line: int | None, key: str) -> None:
        if (code, key) not in seen:
            seen.add((code, key))
            problems.append(Problem(code, message, line))

    # (name, how the message shows it, line, key): names, declared variables, filters.
    named = [(n.name, f"'{n.name}'", n.lineno, n.name) for n in ast.find_all(nodes.Name)]
    named += [(name, f"variable '{name}'", None, name) for name in declared]
    filters = list(ast.find_all(nodes.Filter))
    named += [(n.name, f"filter '{n.name}'", n.lineno, "|" + n.name) for n in filters]
    for name, what, line, key in named:
        if cat := unstable_category(name):
            add(cat, _CATEGORY_TEXT[cat].format(what=what), line, key)
    for node in filters:
        if node.name == "attr" and node.args and _is_private_const(node.args[0]):
            attr = node.args[0].value
            add("sandbox", _escape_text(attr), node.lineno, attr)
    for node in ast.find_all(nodes.Getattr):
        if node.attr.startswith("_"):
            add("sandbox", _escape_text(node.attr), node.lineno, node.attr)
    for node in ast.find_all(nodes.Getitem):
        if _is_private_const(node.arg):
            add("sandbox", _escape_text(node.arg.value), node.lineno, node.arg.value)

    allowed = set(declared) | set(analysis_env.globals)
    if kind == "format":
        allowed |= FORMAT_VARIABLES
    try:
        undeclared = meta.find_undeclared_variables(ast)
    except TemplateAssertionError as exc:  # an unknown filter or test: the compile reports it
        undeclared = set()
        add("template", describe_jinja_error(exc), exc.lineno, "compile")
    for name in sorted(undeclared - allowed):
        if unstable_category(name):
            continue  # already reported under its cause
        line = next((n.lineno for n in ast.find_all(nodes.Name) if n.name == name), None)
        hint = (
            "declare it in the preset's [variables]"
            if kind == "preset"
            else ("a chat format receives only " + ", ".join(sorted(FORMAT_VARIABLES)))
        )
        add("unknown-variable", f"unknown variable '{name}' ({hint})", line, name)

    try:
        analysis_env.from_string(source)  # compile: unknown filters and tests fail here
    except TemplateSyntaxError as exc:
        code = "template" if isinstance(exc, TemplateAssertionError) else "syntax"
        add(code, describe_jinja_error(exc), exc.lineno, "compile")
    return problems


def _absent_filter(*args, **kwargs):
    raise RuntimeError("analysis only")


def _is_private_const(node: nodes.Node) -> bool:
    return (
        isinstance(node, nodes.Const) and isinstance(node.value, str) and node.value.startswith("_")
    )


def _escape_text(attr: str) -> str:
    return (
        f"sandbox violation: reaches private attribute '{attr}' (an attempt to escape the sandbox)"
    )
