"""History longer than the context: which whole turns a prompt leaves out.

The rule is replayed over the conversation's turns every time, so it needs no stored
state and a stateless client (/v1) gets the same kept turns as the chat page for the
same history. At each turn's prompt, in order: while it fits (prompt + the reply's
budget within the context), the turns kept stay as they were; when it no longer does,
the oldest turns go, in one step, until the prompt is at most `target` of the context.
So between two cuts every prompt extends the previous one (cached), and a cut is one
miss every several turns rather than one every turn, as a per-token sliding window
would make it.

The left-out turns are replaced by one marker segment (`templates/prompts/markers/`),
padded to whole KV blocks, so the kept turns start on a block boundary and the system
segment and the marker are shared by every cut conversation on the same preset. With
summaries on, the cut also holds room after the marker for a stored summary of the
turns left out (its own marker template, `history_summary`), so where the cuts fall
does not depend on whether a summary is ready yet.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from jinja2 import TemplateError

from chatapp.prompts.errors import PromptError
from chatapp.prompts.presets import setting, templates_dir
from chatapp.prompts.templating import parse_front_matter, sandbox_environment

DEFAULT_TARGET = 0.5
MARKER = "history_cut"
SUMMARY_MARKER = "history_summary"


@dataclass(frozen=True)
class ContextLimit:
    """What a prompt must fit: the context (prompt and reply together), the reply's
    budget, the share of the context a cut brings the prompt down to, and the room a
    cut holds after the marker for a summary of the turns left out (0: none)."""

    max_model_len: int
    reply_tokens: int
    target: float = DEFAULT_TARGET
    summary_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2")
        if self.reply_tokens < 0:
            raise ValueError("reply_tokens must not be negative")
        if not 0.0 < self.target <= 1.0:
            raise ValueError("the history target must be in (0, 1]")
        if self.summary_tokens < 0:
            raise ValueError("summary_tokens must not be negative")

    @property
    def cut_to(self) -> int:
        """The most prompt tokens a cut leaves: the target share, and room for the reply."""
        return min(int(self.target * self.max_model_len),
                   self.max_model_len - self.reply_tokens)

    def fits(self, prompt_tokens: int) -> bool:
        return prompt_tokens + self.reply_tokens <= self.max_model_len


def history_target() -> float:
    """settings.CHAT_HISTORY_TARGET: the share of the context a cut leaves the prompt."""
    return float(setting("CHAT_HISTORY_TARGET", DEFAULT_TARGET))


@dataclass(frozen=True)
class HistoryCut:
    """The oldest whole turns a prompt leaves out, and the marker standing in for them."""

    turns: int  # whole turns left out (a user message with its replies, calls, results)
    messages: int  # the messages (history segments) they held
    tokens: int  # their tokens
    marker_tokens: int
    new: bool  # this prompt moved the cut: the previous turn's prompt kept more
    summary_tokens: int = 0  # the stored summary after the marker (0: the marker alone)


def first_kept_turn(turn_lengths: Sequence[int], heads: Sequence[int], *, fixed: int,
                    marker: int, limit: ContextLimit) -> tuple[int, int]:
    """(the first turn the last prompt keeps, the first the prompt before it kept).

    `turn_lengths` are the whole earlier turns, oldest first; `heads[t]` is what turn t
    added to its own prompt (its user message; for the last, current turn: all of it so
    far), so heads has one more entry than turn_lengths. `fixed` counts what every prompt
    holds (system segment, reply header); `marker` what a cut adds.
    """
    n = len(turn_lengths)
    if len(heads) != n + 1:
        raise ValueError("heads needs one entry per turn, the current one included")
    sums = [0]
    for length in turn_lengths:
        sums.append(sums[-1] + length)

    def size(first: int, t: int) -> int:
        return fixed + (marker if first else 0) + sums[t] - sums[first] + heads[t]

    first = previous = 0
    for t in range(1, n + 1):
        previous = first
        if limit.fits(size(first, t)):
            continue
        first += 1
        while first < t and size(first, t) > limit.cut_to:
            first += 1
    return first, previous


# -- the marker ----------------------------------------------------------------------


def marker_path(name: str = MARKER):
    return templates_dir() / "markers" / f"{name}.jinja"


def _render(source: str, where, **variables: object) -> str:
    fm = parse_front_matter(source)
    if fm.kind != "marker" or fm.error:
        raise PromptError(f"{where}: missing or invalid '{{#- marker ... #}}' front-matter")
    try:
        text = sandbox_environment("preset").from_string(source).render(**variables).strip()
    except TemplateError as exc:
        raise PromptError(f"{where}: {exc}") from exc
    if not text:
        raise PromptError(f"{where}: the marker renders no text")
    return text


@functools.lru_cache(maxsize=8)
def _render_marker(source: str) -> str:
    return _render(source, marker_path())


def marker_text(source: str | None = None) -> str:
    """The marker's text: the shipped template (or `source`), rendered in the sandbox
    with no variables at all, so nothing but the file can change it."""
    if source is None:
        source = marker_path().read_text(encoding="utf-8")
    return _render_marker(source)


def summary_marker_text(summary: str, source: str | None = None) -> str:
    """The text of the segment that follows the marker with a summary of the turns left
    out: the `history_summary` template (or `source`) given the summary alone. Rendered
    once per summary, whose segment is then stored as ids."""
    if source is None:
        source = marker_path(SUMMARY_MARKER).read_text(encoding="utf-8")
    return _render(source, marker_path(SUMMARY_MARKER), summary=summary)
