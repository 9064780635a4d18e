"""The legacy completions' `logprobs` object: `tokens`, `token_logprobs`,
`top_logprobs` (a {token: logprob} map per token) and `text_offset` (where each token
starts in the choice's `text`, in characters).

The completion's tokens line up with its text as chat's do (logprobs.ContentLogprobs:
the end token and a stop string's tokens left out, a token a stop string begins inside
cut where the text ends). With `echo`, the prompt's tokens come first, every one of
them, so entry i is prompt position i (the first has no logprob: nothing predicts it);
a special token the tokenizer added (a BOS) has no text, so it starts where the next
token does.
"""

from __future__ import annotations

from chatapp.api.v1.logprobs import ContentLogprobs, token_bytes


def empty() -> dict:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def _top(tokenizer, pairs) -> dict[str, float]:
    return {token_bytes(tokenizer, t).decode("utf-8", errors="replace"): lp for t, lp in pairs}


class LegacyLogprobs:
    """One choice's logprobs, handed out in parts as its text grows (a stream's chunks)
    or at once: each part covers the text added since the last."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        self.content = ContentLogprobs(tokenizer)
        self.raw = b""  # the bytes of the tokens handed out so far
        self.chars = 0  # characters of the choice's text before the completion

    def _offset(self) -> int:
        # A character split between tokens is counted once whole, at the token ending it.
        return len(self.raw.decode("utf-8", errors="ignore"))

    def prompt(self, prompt_ids: list[int], scored: list | None, text: str) -> dict:
        """The echoed prompt's part: one entry per prompt token (`scored`: the engine's
        prompt logprobs, None for the first token). `text`: the prompt as echoed."""
        out = empty()
        scored = scored or [None] * len(prompt_ids)
        for token_id, entry in zip(prompt_ids, scored, strict=True):
            special = token_id in self.special
            raw = b"" if special else token_bytes(self.tokenizer, token_id)
            name = self.tokenizer.convert_ids_to_tokens(token_id) if special else (
                raw.decode("utf-8", errors="replace"))
            out["tokens"].append(name)
            out["text_offset"].append(min(self._offset(), len(text)))
            out["token_logprobs"].append(None if entry is None else entry.logprob)
            out["top_logprobs"].append(None if entry is None else _top(self.tokenizer, entry.top))
            self.raw += raw
        self.raw, self.chars = b"", len(text)
        return out

    def take(self, entries: list, content: str, final: bool) -> dict:
        """The part for the completion's tokens that `content` (its text so far, or all of
        it when `final`) newly covers; `entries`: the choice's TokenLogprobs so far."""
        out = empty()
        for e in self.content.take(entries, content, final):
            out["tokens"].append(e["token"])
            out["text_offset"].append(self.chars + self._offset())
            out["token_logprobs"].append(e["logprob"])
            out["top_logprobs"].append({t["token"]: t["logprob"] for t in e["top_logprobs"]})
            self.raw += bytes(e["bytes"])
        return out


def joined(*parts: dict) -> dict:
    """The parts as one object (a whole response's)."""
    out = empty()
    for part in parts:
        for name, values in part.items():
            out[name].extend(values)
    return out
