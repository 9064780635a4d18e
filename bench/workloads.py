"""Workloads for `python -m bench`: sizes, prompt token ids, a long chat.

Prompts are slices of real English (the standard library's docstrings), not
random ids: random ids give the model no structure, and a repeated text would
make the turns of a conversation look alike. The text is fixed for a given
Python version, so runs are comparable.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import asdict, dataclass
from functools import lru_cache

_MODULES = (
    "argparse",
    "asyncio",
    "calendar",
    "collections",
    "csv",
    "datetime",
    "decimal",
    "difflib",
    "email.message",
    "fractions",
    "functools",
    "heapq",
    "http.client",
    "inspect",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "pathlib",
    "pickle",
    "random",
    "shutil",
    "sqlite3",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "unittest",
    "urllib.parse",
    "uuid",
    "zipfile",
)


@dataclass(frozen=True)
class Sizes:
    """How big each measurement is. Warm-ups use the same batch, shorter prompts."""

    prefill_prompts: int
    prefill_len: int
    decode_prompt_len: int
    decode_new_tokens: int
    decode_concurrency: tuple[int, ...]
    conversation_tokens: int
    reply_tokens: int
    warmup_len: int
    warmup_new_tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


# Without AVX512-BF16 or AMX, torch emulates bf16 matmuls: ~20 tokens/s of
# prefill or batched decode for this 135M model on the 2-core machine, where
# the suggested sizes (4 x 512 prefill, 32 x (64 + 64) decode) would
# take half an hour. These defaults fit in about 5 minutes there; the ~1,500-token
# chat of the two-turn check (two full prefills) is most of that. Decode speed
# hardly depends on a 16- vs 64-token context at this size: the matmuls dominate.
FULL = Sizes(
    prefill_prompts=4,
    prefill_len=128,
    decode_prompt_len=16,
    decode_new_tokens=16,
    decode_concurrency=(1, 32),
    conversation_tokens=1500,
    reply_tokens=16,
    warmup_len=8,
    warmup_new_tokens=2,
)
QUICK = Sizes(
    prefill_prompts=4,
    prefill_len=32,
    decode_prompt_len=8,
    decode_new_tokens=4,
    decode_concurrency=(1, 32),
    conversation_tokens=256,
    reply_tokens=4,
    warmup_len=4,
    warmup_new_tokens=2,
)


@lru_cache(maxsize=1)
def corpus_paragraphs() -> tuple[str, ...]:
    """Distinct paragraphs of at least 80 characters from stdlib docstrings."""
    seen: set[str] = set()
    out: list[str] = []
    for name in _MODULES:
        mod = importlib.import_module(name)
        members = [getattr(mod, a, None) for a in sorted(dir(mod)) if not a.startswith("_")]
        for obj in (mod, *members):
            for para in (inspect.getdoc(obj) or "").split("\n\n"):
                para = " ".join(para.split())
                if len(para) >= 80 and para not in seen:
                    seen.add(para)
                    out.append(para)
    return tuple(out)


class TokenSource:
    """Hands out consecutive, non-overlapping slices of the tokenized corpus."""

    def __init__(self, tokenizer):
        text = "\n\n".join(corpus_paragraphs())
        self.ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
        self.pos = 0

    def take(self, length: int) -> list[int]:
        if self.pos + length > len(self.ids):
            self.pos = 0  # wrap: only reached with sizes far above the defaults
        out = self.ids[self.pos : self.pos + length]
        self.pos += length
        return out

    def batch(self, count: int, length: int) -> list[list[int]]:
        return [self.take(length) for _ in range(count)]


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation rendered by the model's chat template, ready to answer."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def build_conversation(tokenizer, target_tokens: int, skip: int = 0) -> list[dict]:
    """A chat of alternating user/assistant paragraphs, ending with a user turn,
    whose rendered prompt holds about target_tokens tokens."""
    paras = corpus_paragraphs()
    messages: list[dict] = [{"role": "system", "content": "You are a concise assistant."}]
    i = skip
    while len(chat_prompt_ids(tokenizer, messages)) < target_tokens - 40:
        role = "user" if messages[-1]["role"] != "user" else "assistant"
        messages.append({"role": role, "content": paras[i % len(paras)]})
        i += 1
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "Which of these points matters most?"})
    return messages


def next_turn_ids(
    tokenizer, messages: list[dict], prompt_ids: list[int], reply_ids: list[int], user_text: str
) -> list[int]:
    """Turn 2 as the engine should see it: turn-1 prompt + the reply's own ids + a new
    user turn. Re-rendering the reply's text could re-tokenize it differently and
    break the shared prefix, so only the template's closing and new turn are rendered."""
    reply_text = "<<REPLY>>"
    closed = tokenizer.apply_chat_template(
        [*messages, {"role": "assistant", "content": reply_text}], tokenize=False
    )
    both = tokenizer.apply_chat_template(
        [
            *messages,
            {"role": "assistant", "content": reply_text},
            {"role": "user", "content": user_text},
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert both.startswith(closed), "chat template does not extend the previous turn"
    closing = closed[closed.index(reply_text) + len(reply_text) :]
    eos = tokenizer.eos_token or ""
    if reply_ids and reply_ids[-1] == tokenizer.eos_token_id and closing.startswith(eos):
        closing = closing[len(eos) :]  # the reply already holds its end-of-turn token
    tail = tokenizer.encode(closing + both[len(closed) :], add_special_tokens=False)
    return [*prompt_ids, *reply_ids, *tail]
