"""Prompt building at token level: the business logic of the prompt manager.

A conversation's prompt is a concatenation of token segments, each encoded once
and then stored as ids:

    system segment      the preset, rendered, padded to whole KV blocks
    history segments    what earlier messages stored (user turns; assistant turns =
                        generation prompt + exactly the generated ids + end of turn)
    new user segment    encoded now; stored with the user message
    generation prompt   the assistant header the reply is generated after

Nothing already stored is rendered or encoded again, so the prompt of turn N+1
starts with every token of turn N's prompt plus its reply, and the engine's prefix
cache serves all of it. Re-encoding a reply's text would not: the same text can
tokenize differently from how it was generated ("\\n"+"\\n" vs "\\n\\n").
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from chatapp.prompts.encoding import TokenEncoder, check_text
from chatapp.prompts.errors import (
    ContextExceeded,
    EmptyMessage,
    FormatError,
    InvalidMessages,
    MessageTooLong,
    PromptError,
)
from chatapp.prompts.formats import format_for_tokenizer
from chatapp.prompts.history import ContextLimit, HistoryCut, first_kept_turn, marker_text
from chatapp.prompts.presets import get_preset, setting

__all__ = [
    "ContextExceeded",
    "ContextLimit",
    "EmptyMessage",
    "HistoryCut",
    "MessageTooLong",
    "PromptBuilder",
    "PromptError",
    "PromptPlan",
    "Segment",
    "builder_for",
    "cache_salt_for",
    "check_user_text",
    "content_text",
    "default_block_size",
    "prefix_hash",
]

DEFAULT_MAX_USER_CHARS = 16000
CACHE_SIZE = 256  # system texts a builder keeps encoded (and presets it knows them from)


def check_user_text(text: object, max_chars: int | None = None) -> str:
    """The rules a user's message obeys, wherever it arrives (chat page, conversations
    API, /v1): text, not blank, not over the limit, nothing a tokenizer can't take."""
    if not isinstance(text, str):
        raise EmptyMessage("a message must be text")
    if not text.strip():
        raise EmptyMessage("the message is empty")
    if max_chars is None:
        max_chars = setting("MAX_USER_MESSAGE_CHARS", DEFAULT_MAX_USER_CHARS)
    limit = int(max_chars)
    if len(text) > limit:
        raise MessageTooLong(f"the message has {len(text)} characters; the limit is {limit}")
    return check_text(text, "the message")


@functools.cache
def builder_for(tokenizer) -> PromptBuilder:
    """The process's one builder for `tokenizer` (it caches encoded system segments)."""
    return PromptBuilder(tokenizer)


def default_block_size() -> int:
    """The engine's KV block size: Django's LLM_BLOCK_SIZE, else EngineConfig's default."""
    value = setting("LLM_BLOCK_SIZE", None)
    if value is not None:
        return int(value)
    from inference.config import EngineConfig

    return int(EngineConfig.__dataclass_fields__["block_size"].default)


def prefix_hash(token_ids: Sequence[int]) -> str:
    """A short, stable name for a token prefix (the dashboard groups prompts by it)."""
    data = b"".join(int(token).to_bytes(4, "little") for token in token_ids)
    return hashlib.sha256(data).hexdigest()[:16]


@dataclass(frozen=True)
class Segment:
    """Where one part of a prompt lies: token_ids[start:end]."""

    kind: str  # "system", "cut" (the marker of left-out turns), "summary" (of those
    # turns, after the marker), "history", "user", "generation_prompt"
    start: int
    end: int


@dataclass(frozen=True)
class PromptPlan:
    token_ids: tuple[int, ...]
    segments: tuple[Segment, ...]
    shared_prefix_len: int  # the block-aligned system segment: shared by every conversation
    preset_id: str | None
    preset_version: str | None
    prefix_hash: str  # of token_ids[:shared_prefix_len]
    new_user_segment: tuple[int, ...]  # store these ids with the new user message
    cache_salt: str | None = None
    cut: HistoryCut | None = None  # the oldest turns left out to fit the context

    @property
    def prompt_tokens(self) -> int:
        return len(self.token_ids)


def _tenant_key(owner) -> str:
    if owner is None or getattr(owner, "is_anonymous", False):
        raise PromptError("a cache salt needs an owner (anonymous requests have no tenant)")
    if isinstance(owner, bool):
        raise PromptError("a cache salt needs an owner")
    if isinstance(owner, int):
        return f"user:{owner}"
    if isinstance(owner, str):
        return f"tenant:{owner}"
    # An organisation shares its cache between its members; otherwise the user is the tenant.
    org_id = getattr(owner, "organization_id", None)
    if org_id is not None:
        return f"org:{org_id}"
    pk = getattr(owner, "pk", None)
    if pk is None:
        raise PromptError("a cache salt needs a saved owner (it has no primary key)")
    return f"user:{pk}"


def cache_salt_for(owner) -> str:
    """Per-tenant cache salt: requests share prefix-cache blocks only within one tenant.

    `owner` is a user (its organisation wins when it has one), a user id (int) or a
    tenant key (str). The salt is an HMAC of that key, so it is stable across
    processes that share the key and reveals nothing about the id. The key is
    settings.PROMPT_CACHE_SALT_KEY, else SECRET_KEY (set one in production, or web
    and worker processes will disagree).
    """
    key = setting("PROMPT_CACHE_SALT_KEY", None) or setting("SECRET_KEY", None)
    if not key:
        raise PromptError("no SECRET_KEY configured for cache salts")
    message = b"prefixchat.cache_salt\x00" + _tenant_key(owner).encode("utf-8")
    return hmac.new(str(key).encode("utf-8"), message, hashlib.sha256).hexdigest()[:32]


class _LRU:
    """A small thread-safe LRU map (the builder is shared by threads and event loops)."""

    def __init__(self, size: int):
        self.size = size
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
            return self._data.get(key)

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)


def _common_suffix_prefix(ids: Sequence[int], tail: Sequence[int]) -> int:
    """Largest k with ids[-k:] == tail[:k]: how much of `tail` `ids` already ends with."""
    for k in range(min(len(ids), len(tail)), 0, -1):
        if list(ids[-k:]) == list(tail[:k]):
            return k
    return 0


class PromptBuilder:
    """Builds token-level prompts for one tokenizer, in the chat format its special tokens name.

    Thread-safe; keep one per tokenizer. `block_size` is the engine's KV block size
    (default: settings.LLM_BLOCK_SIZE).
    """

    def __init__(self, tokenizer, block_size: int | None = None, chat_format=None):
        self.tokenizer = tokenizer
        # `chat_format` (a ChatFormat) overrides the one the tokenizer's tokens name (lint).
        self.chat_format = chat_format = chat_format or format_for_tokenizer(tokenizer)
        self.block_size = int(block_size if block_size is not None else default_block_size())
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.encoder = TokenEncoder(tokenizer)
        self._vocab_size = len(tokenizer)

        # Fixed pieces of the format, encoded once.
        self._generation_prompt = self.encoder.trusted(chat_format.generation_prompt_text)
        self._end_of_turn = self.encoder.trusted(chat_format.end_of_turn)
        # What closes a system turn when no user message continues it ("" but for Gemma).
        self._system_close = self.encoder.trusted(chat_format.system_close_text)
        # The system turn's own closing text: the filler goes just before it.
        self._system_tail = self.encoder.trusted(chat_format.opening_parts("system", "S")[2])
        filler = self.encoder.trusted(chat_format.filler)
        if len(filler) != 1:
            raise FormatError(
                f"chat format {chat_format.name!r}: filler {chat_format.filler!r} is "
                f"{len(filler)} tokens with this tokenizer; it must be exactly one"
            )
        self.filler_id = filler[0]
        stop = self.encoder.trusted(chat_format.stop_token)
        self.stop_token_ids: list[int] = stop if len(stop) == 1 else []

        self._system_ids = functools.lru_cache(maxsize=CACHE_SIZE)(self._encode_system)
        self._markers: dict[tuple[bool, str], tuple[int, ...]] = {}
        self._origin = _LRU(CACHE_SIZE)  # tuple(system ids) -> (preset id, version)

    # -- segments ---------------------------------------------------------------

    def system_segment(
        self,
        preset_id: str,
        version: str | None = None,
        variables: Mapping[str, object] | None = None,
    ) -> list[int]:
        """The preset's system turn, padded to a multiple of block_size (rendered each time,
        encoded once per text)."""
        preset = get_preset(preset_id, version)
        ids = self.system_segment_for_text(preset.render(variables))
        self._origin.put(tuple(ids), (preset.id, preset.version))
        return ids

    def system_segment_for_text(self, text: str) -> list[int]:
        """Any system prompt text as an aligned opening segment (presets and API requests)."""
        return list(self._system_ids(text))

    def _encode_system(self, text: str) -> tuple[int, ...]:
        return tuple(self._pad(self.encoder.parts(*self.chat_format.opening_parts("system", text))))

    def _pad(self, ids: list[int], tail: list[int] | None = None) -> list[int]:
        """Insert filler before the system turn's closing tokens (the end of turn; Gemma's
        blank line before the first user message) so the segment fills whole blocks.

        The filler goes inside the system turn (trailing whitespace of the system
        text, as far as the model can tell) rather than between turns, where the
        model never saw stray tokens. It is added as ids: as text, "\\n" * k would
        merge into other tokens. `tail`: another turn's closing tokens (the marker's).
        """
        pad = -len(ids) % self.block_size
        if pad == 0:
            return ids
        tail = self._system_tail if tail is None else tail
        at = len(ids) - len(tail) if tail and ids[-len(tail) :] == tail else len(ids)
        return ids[:at] + [self.filler_id] * pad + ids[at:]

    def marker_segment(self, *, after_system: bool = True, text: str | None = None) -> list[int]:
        """The marker that stands for left-out turns: a system turn of its own (the marker
        template's text), padded to whole blocks, so that after a block-aligned system
        segment the kept turns start on a block boundary. `after_system`: it follows the
        system segment (Gemma's open turn is closed first); else it opens the prompt."""
        text = marker_text() if text is None else text
        key = (after_system, text)
        if key not in self._markers:
            fmt = self.chat_format
            if after_system:
                parts = fmt.turn_parts("system", text)
                ids = list(self._system_close) + self.encoder.parts(*parts)
            else:
                parts = fmt.opening_parts("system", text)
                ids = self.encoder.parts(*parts)
            self._markers[key] = tuple(self._pad(ids, self.encoder.trusted(parts[2])))
        return list(self._markers[key])

    def summary_segment(self, text: str) -> list[int]:
        """The segment after the marker that holds a summary of the left-out turns: a
        system turn of its own (`text`, the summary marker template's rendering), padded
        to whole blocks like the marker, so the kept turns still start on a boundary.
        Encoded once, when the summary is stored; prompts use the stored ids."""
        parts = self.chat_format.turn_parts("system", text)
        return self._pad(self.encoder.parts(*parts), self.encoder.trusted(parts[2]))

    def user_segment(
        self, text: str, *, opening: bool = False, after_system: bool = False
    ) -> list[int]:
        """The whole user turn, end of turn included. `opening`: it starts the conversation
        (no system prompt), so formats that open with BOS get it here. `after_system`: it
        is the first message after the system segment (Gemma's continues that turn)."""
        check_user_text(text)
        return self._turn(role="user", text=text, opening=opening, after_system=after_system)

    def _turn(
        self, *, role: str, text: str, opening: bool, after_system: bool = False
    ) -> list[int]:
        fmt = self.chat_format
        parts = fmt.opening_parts if opening else (
            fmt.first_turn_parts if after_system else fmt.turn_parts)
        return self.encoder.parts(*parts(role, text))

    def generation_prompt(self) -> list[int]:
        return list(self._generation_prompt)

    def assistant_segment(self, generated_ids: Sequence[int], finished_with_eos: bool) -> list[int]:
        """A finished (or stopped) reply: the generation prompt it followed, exactly the
        generated ids, and whichever end-of-turn tokens the engine did not produce.

        With finished_with_eos the ids may or may not end with the stop token (engines
        differ); either way the turn is closed once. A reply cut short gets the whole
        end of turn.
        """
        ids = self._check_ids(generated_ids, "generated ids", bounded=False)
        eot = self._end_of_turn
        have = _common_suffix_prefix(ids, eot) if finished_with_eos else 0
        return self.generation_prompt() + ids + eot[have:]

    def assistant_segment_from_text(self, text: str) -> list[int]:
        """A reply known only as text (stateless API): encoded after the generation prompt,
        as the model would have produced it, never merged with the header's tokens."""
        before, content, after = self.chat_format.turn_parts("assistant", text)
        header = self.chat_format.generation_prompt_text
        if not before.startswith(header):
            raise FormatError(
                f"chat format {self.chat_format.name!r}: an assistant turn does not start "
                "with the generation prompt"
            )
        return self.generation_prompt() + self.encoder.parts(before[len(header) :], content, after)

    def _check_ids(self, ids: Sequence[int], what: str, *, bounded: bool = True) -> list[int]:
        # Stored ids come back from the database: refuse junk before it reaches the engine.
        # Generated ids are not bounded by the tokenizer (a model's vocabulary may be larger).
        out = list(ids)
        limit = self._vocab_size if bounded else float("inf")
        for token in out:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < limit:
                raise PromptError(f"{what}: {token!r} is not a token id of this tokenizer")
        return out

    # -- prompts ----------------------------------------------------------------

    def build(
        self,
        system_ids: Sequence[int],
        history_segments: Sequence[Sequence[int]],
        new_user_text: str,
        *,
        preset_id: str | None = None,
        preset_version: str | None = None,
        cache_salt: str | None = None,
        limit: ContextLimit | None = None,
        turn_starts: Sequence[bool] | None = None,
        summary: Callable[[int], Sequence[int] | None] | None = None,
    ) -> PromptPlan:
        """The prompt for the reply to `new_user_text`.

        `system_ids` comes from system_segment(); `history_segments` are the stored
        segments of the earlier messages, oldest first. Without a `limit` the whole
        history is kept (whether it fits is the engine's rule, checked against the engine
        that runs it: inference.sampling_params.check_context_length). With one, the
        oldest whole turns are left out as chatapp.prompts.history says; `turn_starts`
        marks the history segments that begin a turn (default: every other one, user
        messages and their replies alternating). `summary(n)`: the stored summary segment
        of a cut that leaves out the first n history segments, or None (the marker
        alone); it stands after the marker, within the room `limit.summary_tokens` holds.
        ContextExceeded when the new turn alone leaves no room for a reply.
        """
        system = self._check_ids(system_ids, "system segment")
        history = [
            self._check_ids(seg, f"history segment {i}") for i, seg in enumerate(history_segments)
        ]
        for i, seg in enumerate(history):
            if not seg:
                raise PromptError(f"history segment {i} is empty (a stored message lost its ids)")
        user = self.user_segment(new_user_text, opening=not system and not history,
                                 after_system=bool(system) and not history)
        if preset_id is None and system:
            preset_id, preset_version = self._origin.get(tuple(system)) or (None, None)
        pieces = [("system", system)] + [("history", seg) for seg in history]
        pieces += [("user", user), ("generation_prompt", self._generation_prompt)]
        preset = (preset_id, preset_version)
        if limit is None:
            return self._plan(pieces, None, preset, cache_salt)
        if turn_starts is None:
            turn_starts = [i % 2 == 0 for i in range(len(history))]
        elif len(turn_starts) != len(history):
            raise PromptError("turn_starts needs one entry per history segment")
        starts = [False, *turn_starts, True, False]
        return self._plan(*self._cut(pieces, starts, limit, summary), preset, cache_salt)

    def build_from_turns(
        self,
        turns: Sequence[tuple[str, str]],
        *,
        assistant_ids_lookup: Callable[[str], Sequence[int] | None] | None = None,
        add_generation_prompt: bool = True,
        cache_salt: str | None = None,
        limit: ContextLimit | None = None,
        turn_starts: Collection[int] | None = None,
    ) -> PromptPlan:
        """A prompt from the (role, text) turns of a stateless request: roles system, user or
        assistant, shapes checked by the caller (the /v1 parser, with content_text).

        With a `limit`, the oldest whole turns are left out as build() does;
        `turn_starts` are the indices of `turns` that begin a turn (default: the user
        messages; /v1 names its users' messages, so tool results, written as user turns
        by some formats, stay with the calls they answer).

        A leading system message becomes a block-aligned segment exactly as a preset
        would, so API clients sending the same system text share its blocks. Each
        assistant message is first offered to `assistant_ids_lookup(text)`: the hook
        where the API splices back the ids it generated for that text (and None
        means "never generated here", so the text is encoded afresh).
        """
        msgs = list(turns)
        if not msgs:
            raise InvalidMessages("messages must not be empty")
        if turn_starts is None:
            turn_starts = {i for i, (role, _) in enumerate(msgs) if role == "user"}
        starts = [i in turn_starts for i in range(len(msgs))]
        for i, (_, text) in enumerate(msgs):
            check_text(text, f"messages[{i}].content")  # before any lookup hashes the text
        pieces: list[tuple[str, Sequence[int]]] = []
        if msgs[0][0] == "system":
            pieces.append(("system", self.system_segment_for_text(msgs[0][1])))
            msgs = msgs[1:]
        else:
            starts.insert(0, False)  # stands for the system piece there is not
        for i, (role, text) in enumerate(msgs):
            opening = not pieces
            after_system = bool(pieces) and i == 0
            if role == "user":
                seg = self.user_segment(text, opening=opening, after_system=after_system)
            elif role == "assistant":
                seg = self._assistant_from_api(text, assistant_ids_lookup, opening)
                seg = (self._system_close if after_system else []) + seg
            else:
                seg = self._turn(role=role, text=text, opening=opening, after_system=after_system)
            new_user = role == "user" and i == len(msgs) - 1
            pieces.append(("user" if new_user else "history", seg))
        if add_generation_prompt:
            close = self._system_close if pieces and pieces[-1][0] == "system" else []
            pieces.append(("generation_prompt", close + self._generation_prompt))
        if limit is None:
            return self._plan(pieces, None, (None, None), cache_salt)
        if pieces[0][0] != "system":
            pieces.insert(0, ("system", []))
        starts += [False] * (len(pieces) - len(starts))
        return self._plan(*self._cut(pieces, starts, limit), (None, None), cache_salt)

    def _cut(self, pieces: list[tuple[str, Sequence[int]]], starts: list[bool],
             limit: ContextLimit, summary: Callable[[int], Sequence[int] | None] | None = None,
             ) -> tuple[list[tuple[str, Sequence[int]]], HistoryCut | None]:
        """`pieces` ("system" first, possibly empty; the reply header last, if any) with the
        oldest whole turns left out behind the marker (and the cut's summary, where
        `summary` has one), as chatapp.prompts.history rules. `starts[i]`: piece i
        begins a turn."""
        system = pieces[0][1]
        header = list(pieces[-1][1]) if pieces[-1][0] == "generation_prompt" else []
        end = len(pieces) - 1 if header else len(pieces)
        groups: list[list[int]] = []  # piece indices of each turn, oldest first
        for i in range(1, end):
            if not groups or (starts[i] and groups[-1]):
                groups.append([])
            groups[-1].append(i)

        def length(group: list[int]) -> int:
            return sum(len(pieces[i][1]) for i in group)

        marker = self.marker_segment(after_system=bool(system))
        fixed = len(system) + len(header)
        heads = [len(pieces[g[0]][1]) for g in groups[:-1]] + [length(groups[-1]) if groups else 0]
        # The summary's room counts whether or not it is ready: the cuts fall where they
        # would with it, so its arrival never moves them.
        first, previous = first_kept_turn([length(g) for g in groups[:-1]], heads, fixed=fixed,
                                          marker=len(marker) + limit.summary_tokens, limit=limit)
        if first == 0:
            kept, cut = pieces, None
        else:
            left_out = [i for g in groups[:first] for i in g]
            cut = HistoryCut(turns=first, messages=len(left_out),
                             tokens=sum(len(pieces[i][1]) for i in left_out),
                             marker_tokens=len(marker), new=first != previous)
            after = self._stored_summary(summary, len(left_out), limit)
            rest = pieces[groups[first][0]:]
            kept = [pieces[0], ("cut", marker), *rest]
            if after and sum(len(seg) for _, seg in kept) + len(after) < limit.max_model_len:
                kept.insert(2, ("summary", after))
                cut = replace(cut, summary_tokens=len(after))
        total = sum(len(seg) for _, seg in kept)
        if total >= limit.max_model_len:
            raise ContextExceeded(total, limit.max_model_len)
        return kept, cut

    def _stored_summary(self, summary, left_out: int, limit: ContextLimit) -> list[int]:
        """The cut's stored summary segment, if it has one that fits the room held for it."""
        ids = summary(left_out) if summary is not None and limit.summary_tokens else None
        if not ids:
            return []
        ids = self._check_ids(ids, "summary segment")
        return ids if len(ids) <= limit.summary_tokens else []

    def _assistant_from_api(self, text: str, lookup, opening: bool) -> list[int]:
        if lookup is not None:
            ids = lookup(text)
            if ids is not None:
                ids = self._check_ids(ids, "remembered reply ids", bounded=False)
                ends = bool(self.stop_token_ids) and bool(ids) and ids[-1] == self.stop_token_ids[0]
                return self.assistant_segment(ids, finished_with_eos=ends)
        if opening:
            return self._turn(role="assistant", text=text, opening=True)
        return self.assistant_segment_from_text(text)

    def _plan(
        self,
        pieces: list[tuple[str, Sequence[int]]],
        cut: HistoryCut | None = None,
        preset: tuple[str | None, str | None] = (None, None),
        cache_salt: str | None = None,
    ) -> PromptPlan:
        """The plan of `pieces`, (kind, ids) in order, with "system" and "user" at most once."""
        ids: list[int] = []
        segments: list[Segment] = []
        for kind, seg in pieces:
            if seg or kind != "system":
                segments.append(Segment(kind, len(ids), len(ids) + len(seg)))
                ids.extend(seg)
        by_kind = dict(pieces)
        shared = len(by_kind.get("system", ())) // self.block_size * self.block_size
        return PromptPlan(
            token_ids=tuple(ids),
            segments=tuple(segments),
            shared_prefix_len=shared,
            preset_id=preset[0],
            preset_version=preset[1],
            prefix_hash=prefix_hash(ids[:shared]),
            new_user_segment=tuple(by_kind.get("user", ())),
            cache_salt=cache_salt,
            cut=cut,
        )


def content_text(content: object, where: str = "content") -> str:
    """The text of an OpenAI-style message's `content`: a string, or an array of text
    parts ({"type": "text", "text": "..."}) joined; None is no text. The text-part rule's
    one owner: the /v1 parser applies it to each message, naming the field by `where`
    (messages[2].content) in the InvalidMessages it raises for anything else."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidMessages(f"'{where}' must be a string or an array of text parts.", where,
                              "invalid_type")
    for j, part in enumerate(content):
        if not (isinstance(part, Mapping) and part.get("type") == "text"
                and isinstance(part.get("text"), str)):
            raise InvalidMessages(f"'{where}[{j}]' must be a text part; other kinds are not "
                                  "supported by this model.", where)
    return "".join(part["text"] for part in content)
