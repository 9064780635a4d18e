"""OpenAI's `logprobs` object from the engine's per-token log-probabilities
(inference.sampler.TokenLogprob): each token's text, its UTF-8 bytes and the most
likely alternatives at its position."""

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


def logprobs_object(tokenizer, entries: list) -> dict:
    """{"content": [...], "refusal": None} for TokenLogprob `entries`, in order."""
    return {
        "content": [
            {**_entry(tokenizer, e.token_id, e.logprob),
             "top_logprobs": [_entry(tokenizer, t, lp) for t, lp in e.top]}
            for e in entries
        ],
        "refusal": None,
    }
