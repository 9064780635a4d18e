"""Text to token ids, keeping the format's special tokens and the user's text apart.

Template text (the format's role markers) is encoded with special tokens parsed.
Content (what a user, a preset variable or a client wrote) is encoded with special
tokens *not* parsed, so typing "<|im_end|><|im_start|>system" yields ordinary text
tokens rather than a forged turn. For content free of such strings the result is
exactly what the tokenizer gives for the whole rendered text, because the
tokenizer itself encodes the text between two special tokens independently.
"""

from __future__ import annotations

import functools
import re

from chatapp.prompts.errors import InvalidText

# A lone surrogate (from JSON "\ud800") cannot be encoded as UTF-8, so the tokenizer
# would fail deep inside; a NUL is never meant as text and some clients send it by mistake.
_BAD_TEXT = re.compile("[\\ud800-\\udfff\\x00]")


def check_text(text: str, what: str = "the text") -> str:
    """`text` if a tokenizer may see it; InvalidText naming `what` otherwise."""
    bad = _BAD_TEXT.search(text)
    if bad is not None:
        kind = "a NUL character" if bad.group() == "\x00" else "a lone UTF-16 surrogate"
        raise InvalidText(f"{what} contains {kind} at position {bad.start()}")
    return text


# A normalizer may shorten text before it is split (NFC joins a letter and its accents):
# the bound allows for text up to this many times longer than what is tokenized.
NORMALIZED_SLACK = 4


@functools.cache
def most_chars_per_token(tokenizer) -> int:
    """The most characters of text one token of `tokenizer` can stand for: any text of
    n characters takes at least n / this many tokens. A vocabulary entry's spelling is
    at least as long as the text it decodes to (a byte-level entry spells each byte with
    one character, a SentencePiece byte as "<0x41>"), so the longest entry bounds it."""
    longest = max((len(entry) for entry in tokenizer.get_vocab()), default=1)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None:
        longest *= NORMALIZED_SLACK
    return max(longest, 1)


class TokenEncoder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        added = [tok.content for tok in tokenizer.added_tokens_decoder.values()]
        # Longest first, so a token that contains another is matched whole; with no added
        # tokens, a pattern that never matches.
        self._added_re = re.compile(
            "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)) or "(?!)"
        )
        self._backend = getattr(tokenizer, "backend_tokenizer", None)

    def trusted(self, text: str) -> list[int]:
        """Template-owned text: special-token strings become special tokens."""
        if not text:
            return []
        return list(
            self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=False)
        )

    def untrusted(self, text: str) -> list[int]:
        """Content: special-token strings stay plain text."""
        if not text:
            return []
        check_text(text)
        backend = self._backend
        if backend is None or backend.model is None:
            return list(
                self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
            )
        # The tokenizer's own pipeline minus its added-token pass. Going through the
        # backend directly avoids flipping its shared `encode_special_tokens` switch,
        # which another thread may be relying on at the same moment.
        if backend.normalizer is not None:
            text = backend.normalizer.normalize_str(text)
        pieces = [text]
        if backend.pre_tokenizer is not None:
            pieces = [piece for piece, _ in backend.pre_tokenizer.pre_tokenize_str(text)]
        return [tok.id for piece in pieces for tok in backend.model.tokenize(piece)]

    def parts(self, before: str, content: str, after: str) -> list[int]:
        """Ids of before + content + after, where only before/after may hold special tokens.

        The plain text on either side of the content (e.g. "user\\n" after
        "<|im_start|>") is encoded together with it, as the tokenizer would.
        """
        cut_before = max((m.end() for m in self._added_re.finditer(before)), default=0)
        first = self._added_re.search(after)
        cut_after = first.start() if first else len(after)
        return (
            self.trusted(before[:cut_before])
            + self.untrusted(before[cut_before:] + content + after[:cut_after])
            + self.trusted(after[cut_after:])
        )
