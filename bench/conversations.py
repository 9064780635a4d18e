"""Chat workloads shared by the HTTP benchmark and the in-process multi-turn run.

- multiturn: N conversations of T user turns each, all opening with the same
  system prompt of S tokens; user turns of U tokens; replies of R tokens. A turn's
  messages carry the replies the server actually gave to the earlier turns.
- prefix: N one-turn requests sharing a system prompt of S tokens (the long
  prefix), each with its own user message of U tokens.
- random: N one-turn requests sharing nothing: each has its own system prompt of
  S tokens and user message of U tokens, so an ideal cache hits 0 %.
- a JSONL file: one conversation per line, a list of {role, content} (or an object
  with "messages"); leading system messages are kept, user turns are replayed in
  order and the file's assistant messages are replaced by the server's replies.

Text is drawn from a fixed word list by a seeded generator, so a workload depends
only on its parameters (and on the tokenizer that counts its tokens).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

WORKLOADS = ("multiturn", "prefix", "random")

# Common English words: most are one token (with their leading space) in BPE vocabularies.
_WORD_TEXT = """
    the of and to in is for that on with as by at from this be are it was or an not have
    can will more about which their one all has new other time there when some what use
    into also two make first any these many most people then only may over such year
    work way part each find good long day number small large world well place after city
    water back sound light house point home hand high old great state show change every
    near road land food keep tree open river book paper story music market plan garden
    table window school street number color voice green summer winter spring morning
    night simple clear quick slow warm cold bright dark early late short young strong
    free full half best right left north south east west level field model system order
    value power group line family friend teacher student office letter window design
    island forest mountain valley ocean bridge station village region county border
    stone metal glass wood cotton silver gold copper iron bread rice apple orange lemon
    coffee sugar salt honey butter cheese garden flower seed leaf branch root grass cloud
    rain snow wind storm fire earth moon star planet energy signal engine wheel train
    plane boat ship truck bicycle camera screen phone radio letter number answer
    question reason method result report review record series season chapter section
    figure detail example pattern process project program version problem solution
"""
WORDS = tuple(dict.fromkeys(_WORD_TEXT.split()))


@dataclass
class Turn:
    user: str
    user_tokens: int  # the bare text's tokens (the tokenizer's count, or its word count)


@dataclass
class Conversation:
    index: int
    system: str | None
    turns: list[Turn]
    system_tokens: int = 0

    def messages(self, replies: list[str]) -> list[dict]:
        """The messages of turn len(replies) + 1: earlier turns with their replies, then
        the next user message."""
        k = len(replies)
        if k >= len(self.turns):
            raise IndexError(f"conversation {self.index} has {len(self.turns)} turns")
        out = [{"role": "system", "content": self.system}] if self.system is not None else []
        for turn, reply in zip(self.turns, replies, strict=False):
            out += [{"role": "user", "content": turn.user}, {"role": "assistant", "content": reply}]
        out.append({"role": "user", "content": self.turns[k].user})
        return out


@dataclass
class Workload:
    name: str
    conversations: list[Conversation]
    reply_tokens: int
    params: dict = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)

    def system_seen_before(self, index: int, warmed: bool = True) -> bool:
        """Whether conversation `index`'s system prompt opened an earlier conversation
        or the warm-up (which uses conversation 0's): only then can a cache hold it."""
        system = self.conversations[index].system
        if system is None:
            return False
        return any(c.system == system for c in self.conversations[:index]) or (
            warmed and index == 0 and self.name != "random"
        )

    def warmup_messages(self) -> list[dict]:
        """One request before timing: it loads what a first request loads, and puts the
        shared system prompt in the cache (as a live server's earlier traffic would)."""
        first = self.conversations[0]
        user = {"role": "user", "content": "Say hello."}
        if self.name == "random" or first.system is None:
            return [{"role": "system", "content": "Warm-up."}, user]
        return [{"role": "system", "content": first.system}, user]

    def describe(self) -> dict:
        return {
            "name": self.name,
            **self.params,
            "conversations": len(self.conversations),
            "requests": self.num_requests,
            "reply_tokens": self.reply_tokens,
        }


# --- text ----------------------------------------------------------------------
TokenCounter = Callable[[str], int]


def token_counter(tokenizer) -> TokenCounter | None:
    if tokenizer is None:
        return None
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def _join(words: list[str]) -> str:
    text = " ".join(words)
    return text[:1].upper() + text[1:]


def make_text(
    rng: random.Random, tokens: int, count: TokenCounter | None = None
) -> tuple[str, int]:
    """Words from WORDS making about `tokens` tokens; with a counter, exactly `tokens`
    unless a multi-token word keeps it one off. Returns (text, its token count)."""
    if tokens <= 0:
        return "", 0
    words = [rng.choice(WORDS) for _ in range(tokens)]
    if count is None:
        return _join(words), len(words)
    n = count(_join(words))
    for _ in range(2 * tokens + 8):  # bounded: each round moves toward the target
        if n == tokens or (n > tokens and len(words) == 1):
            break
        if n > tokens:
            del words[-max(1, (n - tokens) // 2) :]
        else:
            words += [rng.choice(WORDS) for _ in range(max(1, (tokens - n) // 2))]
        n = count(_join(words))
    return _join(words), n


def seeded_rng(seed: int, *parts) -> random.Random:
    """A generator of its own for each (seed, parts): one piece of text never moves
    another."""
    return random.Random(":".join(str(p) for p in (seed, *parts)))


# --- builders ------------------------------------------------------------------
def multiturn(
    conversations: int,
    turns: int,
    system_tokens: int,
    user_tokens: int,
    reply_tokens: int,
    seed: int = 0,
    tokenizer=None,
) -> Workload:
    count = token_counter(tokenizer)
    system, s_tokens = make_text(seeded_rng(seed, "system"), system_tokens, count)
    convs = []
    for i in range(conversations):
        rng = seeded_rng(seed, "multiturn", i)
        ts = [Turn(*make_text(rng, user_tokens, count)) for _ in range(turns)]
        convs.append(Conversation(i, system or None, ts, s_tokens))
    params = {
        "turns": turns,
        "system_tokens": system_tokens,
        "user_tokens": user_tokens,
        "seed": seed,
    }
    return Workload("multiturn", convs, reply_tokens, params)


def prefix(
    requests: int,
    prefix_tokens: int,
    suffix_tokens: int,
    reply_tokens: int,
    seed: int = 0,
    tokenizer=None,
) -> Workload:
    count = token_counter(tokenizer)
    system, s_tokens = make_text(seeded_rng(seed, "prefix"), prefix_tokens, count)
    convs = [
        Conversation(
            i,
            system,
            [Turn(*make_text(seeded_rng(seed, "suffix", i), suffix_tokens, count))],
            s_tokens,
        )
        for i in range(requests)
    ]
    params = {
        "turns": 1,
        "system_tokens": prefix_tokens,
        "user_tokens": suffix_tokens,
        "seed": seed,
    }
    return Workload("prefix", convs, reply_tokens, params)


def random_requests(
    requests: int,
    system_tokens: int,
    user_tokens: int,
    reply_tokens: int,
    seed: int = 0,
    tokenizer=None,
) -> Workload:
    count = token_counter(tokenizer)
    convs = []
    for i in range(requests):
        rng = seeded_rng(seed, "random", i)
        system, s_tokens = make_text(rng, max(system_tokens, 1), count)
        convs.append(Conversation(i, system, [Turn(*make_text(rng, user_tokens, count))], s_tokens))
    params = {"turns": 1, "system_tokens": system_tokens, "user_tokens": user_tokens, "seed": seed}
    return Workload("random", convs, reply_tokens, params)


def build(
    name: str,
    *,
    conversations: int,
    turns: int,
    system_tokens: int,
    user_tokens: int,
    reply_tokens: int,
    seed: int = 0,
    tokenizer=None,
    jsonl: str | Path | None = None,
) -> Workload:
    """The workload `name` of this shape; with jsonl, that file's first `conversations`
    conversations instead (the shape then gives only reply_tokens)."""
    if jsonl is not None:
        return load_jsonl(jsonl, reply_tokens, tokenizer, conversations)
    if name == "multiturn":
        return multiturn(
            conversations, turns, system_tokens, user_tokens, reply_tokens, seed, tokenizer
        )
    if name == "prefix":
        return prefix(conversations, system_tokens, user_tokens, reply_tokens, seed, tokenizer)
    if name == "random":
        return random_requests(
            conversations, system_tokens, user_tokens, reply_tokens, seed, tokenizer
        )
    raise ValueError(f"unknown workload {name!r} (one of {', '.join(WORKLOADS)})")


def _content(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI text parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def load_jsonl(
    path: str | Path, reply_tokens: int, tokenizer=None, limit: int | None = None
) -> Workload:
    """Conversations from a JSONL file of message lists (see the module docstring)."""
    count = token_counter(tokenizer) or (lambda text: len(text.split()))
    convs: list[Conversation] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON ({exc})") from None
            if isinstance(data, dict):
                data = data.get("messages")
            if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
                raise ValueError(f"{path}:{lineno}: expected a list of {{role, content}} objects")
            system_parts: list[str] = []
            turns: list[Turn] = []
            for m in data:
                role = m.get("role")
                if role in ("system", "developer") and not turns:
                    system_parts.append(_content(m))
                elif role == "user":
                    text = _content(m)
                    turns.append(Turn(text, count(text)))
                elif role not in ("assistant", "system", "developer", "tool"):
                    raise ValueError(f"{path}:{lineno}: unknown role {role!r}")
            if not turns:
                continue
            system = "\n\n".join(system_parts) if system_parts else None
            convs.append(Conversation(len(convs), system, turns, count(system) if system else 0))
            if limit is not None and len(convs) >= limit:
                break
    if not convs:
        raise ValueError(f"{path}: no conversation with a user message")
    params = {"source": str(path), "turns": max(len(c.turns) for c in convs)}
    return Workload("jsonl", convs, reply_tokens, params)


def template_overhead(tokenizer) -> int:
    """Tokens the chat template adds around a new user message, generation prompt
    included (0 without a tokenizer or template)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return 0
    base = [{"role": "system", "content": "Be brief."}]
    user = {"role": "user", "content": "hello there"}
    before = tokenizer.apply_chat_template(base, tokenize=False)
    after = tokenizer.apply_chat_template([*base, user], tokenize=False, add_generation_prompt=True)
    if not after.startswith(before):
        return 0
    enc = token_counter(tokenizer)
    return max(0, enc(after[len(before) :]) - enc("hello there"))
