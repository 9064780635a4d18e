"""OpenAI's `logprobs` object from the engine's per-token log-probabilities
(inference.sampler.TokenLogprob): each token's text, its UTF-8 bytes and the most
likely alternatives at its position.

Its `content` lines up with the message's: it holds exactly the tokens whose text makes
the content, so their bytes joined are the content's. The end token, special tokens
(which have no text) and the tokens of a stop string are left out; a token that the stop
string begins inside is kept with its bytes cut where the content ends (`ContentLogprobs`).
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: a token's characters back to its bytes."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def token_bytes(tokenizer, token_id: int) -> bytes:
    """The bytes a token stands for: exact for byte-level BPE (a token may hold part of a
    character), the decoded text's UTF-8 otherwise."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    decoder = _byte_decoder()
    if isinstance(piece, str) and piece and all(ch in decoder for ch in piece):
        return bytes(decoder[ch] for ch in piece)
    return tokenizer.decode([token_id]).encode()


def _entry(tokenizer, token_id: int, logprob: float) -> dict:
    raw = token_bytes(tokenizer, token_id)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob,
            "bytes": list(raw)}


def logprobs_object(content: list[dict]) -> dict:
    """{"content": [...], "refusal": None} for entries ContentLogprobs.take made."""
    return {"content": content, "refusal": None}


class ContentLogprobs:
    """One choice's logprob entries handed out as its content grows: each call to `take`
    returns the entries of the tokens that the content, as it now stands, newly covers."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        self.next = 0  # the next TokenLogprob to place
        self.covered = 0  # bytes of the content the entries handed out make

    def take(self, entries: list, content: str, final: bool) -> list[dict]:
        """`entries`: every TokenLogprob of the choice so far; `content`: its text so far.
        A token whose bytes run past the content waits for more, unless `final`: then
        the content ended inside it (a stop string) and it is cut there."""
        size = len(content.encode())
        out = []
        while self.next < len(entries) and self.covered < size:
            e = entries[self.next]
            if e.token_id in self.special:  # no text of its own
                self.next += 1
                continue
            raw = token_bytes(self.tokenizer, e.token_id)
            if self.covered + len(raw) > size:
                if not final:
                    break
                raw = raw[: size - self.covered]
            out.append({"token": raw.decode("utf-8", errors="replace"), "logprob": e.logprob,
                        "bytes": list(raw),
                        "top_logprobs": [_entry(self.tokenizer, t, lp) for t, lp in e.top]})
            self.covered += len(raw)
            self.next += 1
        return out
