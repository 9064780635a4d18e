"""What a model's own file says of it, without loading it: where it lies, when it was
written, and whether it carries a chat template.

A model whose file has no chat template is a base model, trained to continue text: it
is served for completions, not chat (the service decides; the engine runs either). A
GGUF file names its template in its metadata (`tokenizer.chat_template`); a Hugging
Face folder in tokenizer_config.json or a chat_template.jinja / .json beside it. The
folder the engine writes for a GGUF file is not asked: it may hold a turn format the
conversion gave a file that had none (inference.gguf_models).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from inference.config import DEFAULT_MODEL
from inference.loader import gguf_source, resolve_model_path

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def model_file(model: str = DEFAULT_MODEL, cache_dir: str | None = None) -> Path:
    """The file a model comes from: its .gguf, or a Hugging Face folder's config.json.
    ModelNotFoundError when there is none."""
    source = gguf_source(model, cache_dir)
    if source is not None:
        return source
    return resolve_model_path(model, cache_dir) / "config.json"


def created(model: str = DEFAULT_MODEL, cache_dir: str | None = None) -> int:
    """When the model's file was last written (Unix seconds)."""
    return int(model_file(model, cache_dir).stat().st_mtime)


def has_chat_template(model: str = DEFAULT_MODEL, cache_dir: str | None = None) -> bool:
    """Whether the model's own file carries a chat template."""
    path = model_file(model, cache_dir)
    st = path.stat()
    return _has_chat_template(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _has_chat_template(path: str, size: int, mtime_ns: int) -> bool:
    # Keyed by size and time too: a file replaced in place is asked again.
    file = Path(path)
    if file.suffix == ".gguf":
        from inference.gguf_file import GGUFFile

        return bool(GGUFFile(file).metadata.get("tokenizer.chat_template"))
    folder = file.parent
    if any((folder / name).is_file() for name in TEMPLATE_FILES):
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(isinstance(config, dict) and config.get("chat_template"))
