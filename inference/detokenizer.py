"""Incremental detokenization that never emits half of a multi-byte character."""

from __future__ import annotations

from inference.sequence import Sequence


def detokenize_incrementally(tokenizer, seq: Sequence) -> None:
    """Append the text of newly generated tokens to seq.text.

    Decoding a short window before the new tokens keeps byte-level merges right;
    a window that ends in U+FFFD is an unfinished character, so we wait.
    """
    if tokenizer is None:
        return
    out = seq.output_token_ids
    prefix = tokenizer.decode(out[seq.prefix_offset : seq.read_offset], skip_special_tokens=True)
    full = tokenizer.decode(out[seq.prefix_offset :], skip_special_tokens=True)
    if len(full) > len(prefix) and not full.endswith("\ufffd"):
        seq.text += full[len(prefix) :]
        seq.prefix_offset = seq.read_offset
        seq.read_offset = len(out)


def find_stop_string(text: str, stops: list[str], search_from: int) -> int | None:
    """Index where the earliest stop string starts at or after search_from, if any."""
    best = None
    for s in stops:
        i = text.find(s, max(0, search_from - len(s) + 1))
        if i != -1 and (best is None or i < best):
            best = i
    return best
