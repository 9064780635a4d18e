"""Chat formats: how roles are wrapped in special tokens (templates/prompts/formats/).

A chat format is a Jinja2 template with the Hugging Face chat-template contract
(`messages`, `add_generation_prompt`, `bos_token`, `eos_token`) plus front-matter
naming its tokens::

    {#- format
    name = "chatml"
    special_tokens = ["<|im_start|>", "<|im_end|>"]   # how a tokenizer is recognised
    stop_token = "<|im_end|>"                          # the token that ends a reply
    end_of_turn = "<|im_end|>\\n"                       # text that closes every turn
    filler = "\\n"                                      # one token, pads the system turn
    -#}

The prompt builder never renders a whole conversation. It renders one message
at a time, as the difference between the format applied to a fixed probe
conversation with and without that message, so a message's text is the same
whatever comes before or after it. That is only sound for formats that do not
rewrite history; `prompts lint` checks exactly that.

Three places a message can stand: opening the conversation (BOS included), right
after the opening system message, or after a reply. The middle one matters for
formats without a system role: Gemma's system text opens the first user turn,
which the first user message then continues (`first_turn_parts`), and whatever
else follows the system text closes that turn first (`system_close_text`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path

from jinja2 import TemplateError

from chatapp.prompts.errors import FormatError
from chatapp.prompts.presets import templates_dir
from chatapp.prompts.templating import parse_front_matter, sandbox_environment
from chatapp.prompts.tools import CONVENTIONS

# Stands in for a message's content while probing the format; private-use code points
# keep it from meeting anything a template could do to ordinary text.
SENTINEL = "\ue000PREFIXCHAT\ue001"

# Probe conversations: a message of role r is rendered after _PROBES[r].
_AFTER_A_REPLY = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A"},
]
_AFTER_SYSTEM = _AFTER_A_REPLY[:1]
_PROBES = {"user": _AFTER_A_REPLY, "assistant": _AFTER_A_REPLY[:2], "system": _AFTER_A_REPLY}
# Tool results come back in a role of their own in some conventions (chatapp.prompts.tools):
# probed like a user message.
RESULT_ROLES = ("ipython", "tool")
ROLES = (*_PROBES, *RESULT_ROLES)


def formats_dir() -> Path:
    return templates_dir() / "formats"


def _probe(role: str) -> list[dict[str, str]]:
    if role not in ROLES:
        raise FormatError(f"role {role!r} is not supported (use one of {', '.join(ROLES)})")
    return _PROBES.get(role, _AFTER_A_REPLY)


class ChatFormat:
    """One chat format: render whole conversations, or one turn split around its content."""

    REQUIRED = ("name", "special_tokens", "stop_token", "end_of_turn", "filler")

    def __init__(self, source: str, path: Path | None = None):
        fm = parse_front_matter(source)
        where = str(path) if path else "chat format"
        if fm.error:
            raise FormatError(f"{where}: {fm.error}")
        if fm.kind != "format":
            raise FormatError(f"{where}: missing '{{#- format ... #}}' front-matter")
        missing = [key for key in self.REQUIRED if key not in fm.meta]
        if missing:
            raise FormatError(f"{where}: front-matter lacks {', '.join(missing)}")
        meta = fm.meta
        self.name: str = str(meta["name"])
        self.special_tokens: tuple[str, ...] = tuple(meta["special_tokens"])
        self.stop_token: str = str(meta["stop_token"])
        self.end_of_turn: str = str(meta["end_of_turn"])
        self.filler: str = str(meta["filler"])
        self.bos_token: str = str(meta.get("bos_token", ""))
        # How tools and calls are written in this format's turns (chatapp.prompts.tools).
        self.tool_calls: str = str(meta.get("tool_calls", "hermes"))
        if self.tool_calls not in CONVENTIONS:
            names = ", ".join(f'"{name}"' for name in CONVENTIONS)
            raise FormatError(f"{where}: tool_calls must be one of {names}")
        try:
            self._template = sandbox_environment("format").from_string(source)
        except TemplateError as exc:
            raise FormatError(f"{where}: {exc}") from exc
        self._probe_deltas: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"ChatFormat({self.name!r})"

    def render(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False
    ) -> str:
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.stop_token,
            )
        except FormatError:
            raise
        except (TemplateError, ArithmeticError, LookupError, TypeError, ValueError) as exc:
            # Runtime errors inside the template are the format's fault, not the caller's.
            raise FormatError(f"chat format {self.name!r} failed to render: {exc}") from exc

    def _delta(self, role: str, content: str, probe: list[dict[str, str]] | None = None) -> str:
        probe = _probe(role) if probe is None else probe
        base = self.render(probe)
        full = self.render([*probe, {"role": role, "content": content}])
        if not full.startswith(base):
            raise FormatError(
                f"chat format {self.name!r} rewrites earlier messages when a {role} message "
                "is added; run `manage.py prompts lint` on it"
            )
        return full[len(base) :]

    def _split(self, rendered: str, probe_rendered: str, what: str) -> tuple[str, str, str]:
        if probe_rendered.count(SENTINEL) != 1:
            raise FormatError(
                f"chat format {self.name!r} does not render {what} content exactly once"
            )
        before, after = probe_rendered.split(SENTINEL)
        fits = len(rendered) >= len(before) + len(after)
        if not (fits and rendered.startswith(before) and rendered.endswith(after)):
            raise FormatError(f"chat format {self.name!r} wraps {what} differently by content")
        return before, rendered[len(before) : len(rendered) - len(after)], after

    def turn_parts(self, role: str, content: str) -> tuple[str, str, str]:
        """(text before the content, the content as the format renders it, text after)
        for a `role` message that follows other messages."""
        if role not in self._probe_deltas:
            self._probe_deltas[role] = self._delta(role, SENTINEL)
        return self._split(
            self._delta(role, content), self._probe_deltas[role], f"a {role} message's"
        )

    def first_turn_parts(self, role: str, content: str) -> tuple[str, str, str]:
        """Like turn_parts, for the message right after the opening system message (for
        ChatML and Llama 3 the same as turn_parts; Gemma's first user message continues
        the turn the system text opened)."""
        _probe(role)
        key = "after system: " + role
        if key not in self._probe_deltas:
            self._probe_deltas[key] = self._delta(role, SENTINEL, _AFTER_SYSTEM)
        return self._split(
            self._delta(role, content, _AFTER_SYSTEM),
            self._probe_deltas[key],
            f"the {role} message after the system message's",
        )

    @functools.cached_property
    def system_close_text(self) -> str:
        """What a reply right after the opening system message is preceded by, besides the
        generation prompt: "" where the system turn is closed already (ChatML, Llama 3),
        the end of the user turn the system text opened (Gemma)."""
        base = self.render(_AFTER_SYSTEM)
        with_prompt = self.render(_AFTER_SYSTEM, add_generation_prompt=True)
        header = self.generation_prompt_text
        if not (with_prompt.startswith(base) and with_prompt.endswith(header)
                and len(with_prompt) >= len(base) + len(header)):
            raise FormatError(
                f"chat format {self.name!r}: the generation prompt after the system message "
                "rewrites the prompt or is not the usual one"
            )
        return with_prompt[len(base) : len(with_prompt) - len(header)]

    def opening_parts(self, role: str, content: str) -> tuple[str, str, str]:
        """Like turn_parts, for the message that opens a conversation (BOS included)."""
        _probe(role)
        rendered = self.render([{"role": role, "content": content}])
        probe = self.render([{"role": role, "content": SENTINEL}])
        return self._split(rendered, probe, f"the opening {role} message's")

    @functools.cached_property
    def generation_prompt_text(self) -> str:
        probe = _PROBES["assistant"]
        without = self.render(probe)
        with_prompt = self.render(probe, add_generation_prompt=True)
        if not with_prompt.startswith(without):
            raise FormatError(
                f"chat format {self.name!r}: the generation prompt rewrites the prompt"
            )
        return with_prompt[len(without) :]


@functools.lru_cache(maxsize=32)
def _load(source: str, path: str) -> ChatFormat:
    return ChatFormat(source, Path(path))


def list_formats() -> list[ChatFormat]:
    paths = sorted(formats_dir().glob("*.jinja"))
    return [_load(p.read_text(encoding="utf-8"), str(p)) for p in paths]


def get_format(name: str) -> ChatFormat:
    for fmt in list_formats():
        if fmt.name == name:
            return fmt
    raise FormatError(f"no chat format named {name!r}")


def format_for_tokenizer(tokenizer) -> ChatFormat:
    """The shipped format whose special tokens the tokenizer has (most specific first)."""
    vocab = tokenizer.get_vocab()
    candidates = sorted(list_formats(), key=lambda f: (-len(f.special_tokens), f.name))
    for fmt in candidates:
        if fmt.special_tokens and all(tok in vocab for tok in fmt.special_tokens):
            return fmt
    raise FormatError(
        "no chat format matches this tokenizer's special tokens "
        f"(known formats: {', '.join(f.name for f in candidates) or 'none'})"
    )
