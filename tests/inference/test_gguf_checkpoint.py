"""A GGUF file served as it is: small random files of the Llama and Qwen2 families in
each block type, loaded by the engine from their blocks and held to transformers'
reading of the same file (the gguf package's dequantizers, Llama's q/k rows put back)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from bench.random_gguf import TINY, write
from inference import file_weights
from inference.config import EngineConfig
from inference.gguf_checkpoint import BlockEmbedding, GGUFCheckpoint
from inference.gguf_weights import EXACT_TYPES, rounding_bound
from inference.llm_engine import LLMEngine
from inference.loader import load_config, reference_model, resolve_model_path
from inference.sampling_params import SamplingParams
from kernels.quant_linear import dequantize

# (family, mix): Q8_0 (int8, exact), Q4_1 (int4, exact), Q5_K (8 bits with an offset),
# Q4_K_M (Q4_K on int4 beside Q6_K quantized again), and Qwen2's biases and unpermuted
# rows. Each type on each of our kinds is held to gguf's dequantizers in
# test_gguf_weights.py; these hold the names, fusing and row orders of whole models.
CASES = [("llama", "Q8_0"), ("llama", "Q4_1"), ("llama", "Q5_K"), ("llama", "Q4_K_M"),
         ("qwen2", "Q4_K_M")]
PROMPT = list(range(100, 140))  # ids of the small models' 2,048-token vocabulary


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="module")
def loaded(files, cache):
    """(engine, transformers' state dict) of a file, one of each per file."""
    made = {}

    def get(family: str, mix: str):
        if (family, mix) not in made:
            path = files(family, mix)
            made[family, mix] = (engine(path, cache),
                                 reference_model(str(path), str(cache)).state_dict())
        return made[family, mix]

    return get


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf-files")
    made = {}

    def get(family: str, mix: str):
        if (family, mix) not in made:
            made[family, mix] = write(folder / f"{family}-{mix}.gguf", TINY[family], mix)
        return made[family, mix]

    return get


def engine(path, cache_dir, **kw) -> LLMEngine:
    kw.setdefault("dtype", "float32")
    # fp32 K/V: the reference keeps K/V in fp32, and int8 rows part greedy ties.
    kw.setdefault("kv_dtype", "float32")
    return LLMEngine(EngineConfig(model=str(path), model_cache_dir=str(cache_dir),
                                  num_blocks=64, **kw))


def file_types(path) -> dict[str, T]:
    from inference.gguf_file import GGUFFile

    return {t.name: t.tensor_type for t in GGUFFile(path).tensors}


@pytest.mark.parametrize(("family", "mix"), CASES, ids=lambda c: c)
def test_served_weights_are_the_files(files, loaded, cache, family, mix):
    """Every matmul row holds the file's values: bit for bit where its kind holds the
    type exactly, within the fp16 rounding of a k-quant's scales, and within half a
    step of its own grid where it was quantized again (Q6_K)."""
    path = files(family, mix)
    eng, ref = loaded(family, mix)
    model = eng.runner.model
    sources = model.checkpoint_sources()
    checkpoint = GGUFCheckpoint(path, load_config(resolve_model_path(str(path), str(cache))))
    types = {name: [file_types(path)[checkpoint.gguf_name(s)] for s in sources[name]]
             for name in sources}
    for name, layer in model.linear_layers().items():
        qw = layer.quantized
        got, bound = dequantize(qw, torch.float32), rounding_bound(qw)
        want = torch.cat([ref[s] for s in sources[name]])
        start = 0
        for source, qtype in zip(sources[name], types[name], strict=True):
            rows = slice(start, start + ref[source].shape[0])
            start = rows.stop
            err = (got[rows] - want[rows]).abs()
            if qtype in EXACT_TYPES and not (qtype == T.Q8_0 and qw.kind == "uint8"):
                assert torch.equal(got[rows], want[rows]), name
            elif qtype in (T.Q4_K, T.Q5_K):
                assert bool((err <= bound[rows]).all()), name
            else:  # quantized again (Q6_K): within a step of an 8-bit grid (half a step
                # and the fp16 rounding of its scale and offset), a quarter of Q6_K's
                assert qtype == T.Q6_K
                assert qw.kind == "uint8", name
                group = want[rows].reshape(-1, 32)
                span = (group.abs().amax(-1) * 2 / 254 if qw.kind == "int8"
                        else (group.amax(-1) - group.amin(-1)) / 255)
                err = err.reshape(-1, 32).amax(-1)
                assert bool((err <= span).all()), name


@pytest.mark.parametrize(("family", "mix"), [("llama", "Q8_0"), ("llama", "Q4_K_M"),
                                             ("qwen2", "Q4_K_M")], ids=lambda c: c)
def test_greedy_replies_are_transformers_on_the_same_file(files, loaded, cache, family, mix):
    path = files(family, mix)
    ours = loaded(family, mix)[0].generate([PROMPT], SamplingParams(max_tokens=8, temperature=0))
    ref = reference_model(str(path), str(cache))
    with torch.no_grad():
        want = ref.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False)
    assert ours[0][0].token_ids == want[0, len(PROMPT):].tolist()


def test_token_embeddings_are_the_files_rows(loaded):
    """An untied table (Qwen2 here) is looked up in the file's own rows, exactly."""
    eng, state = loaded("qwen2", "Q4_K_M")
    model = eng.runner.model
    assert isinstance(model.embed_tokens, BlockEmbedding)
    ref = state["model.embed_tokens.weight"]
    ids = torch.tensor([0, 5, 2047, 1234, 5])
    assert torch.equal(model.embed_tokens(ids), ref[ids])


def test_the_first_start_writes_no_fp32_copy_and_later_starts_map_the_cache(files, tmp_path):
    path = files("llama", "Q4_K_M")
    eng = engine(path, tmp_path)
    first = eng.runner.model.lm_head.quantized
    folder = resolve_model_path(str(path), str(tmp_path))
    assert not list(folder.glob("*.safetensors"))  # config and tokenizer only
    caches = list(tmp_path.glob("*.pt"))
    assert len(caches) == 1
    # The stored weights are no larger than the file's blocks plus Q6_K's wider grid.
    assert caches[0].stat().st_size < 1.5 * path.stat().st_size
    again = engine(path, tmp_path).runner.model
    assert torch.equal(again.lm_head.quantized.data, first.data)
    checkpoint = GGUFCheckpoint(path, load_config(folder))
    assert file_weights.load(engine_model(path, tmp_path), checkpoint, "int4", tmp_path)


def engine_model(path, cache_dir):
    from inference.models.registry import build_model

    return build_model(load_config(resolve_model_path(str(path), str(cache_dir))))


def test_a_changed_file_is_read_again(files, tmp_path):
    """The cache and the folder are named by the file's size and time: a file
    rewritten in place is never served from the old one's weights."""
    src = files("llama", "Q8_0")
    path = tmp_path / "model.gguf"
    path.write_bytes(src.read_bytes())
    before = engine(path, tmp_path).runner.model.lm_head.quantized.data.clone()
    write(path, TINY["llama"], "Q8_0", seed=1)
    after = engine(path, tmp_path).runner.model.lm_head.quantized.data
    assert not torch.equal(before, after)
    assert len(list(tmp_path.glob("*.pt"))) == 2


def test_a_tied_q8_0_table_is_read_from_the_head(loaded):
    """SmolLM2's layout: a tied Q8_0 table held exactly by the int8 head is looked up
    there, with no second copy of the table."""
    from inference.models.llama import HeadEmbedding

    model = loaded("llama", "Q8_0")[0].runner.model
    assert isinstance(model.embed_tokens, HeadEmbedding)


def test_weights_in_fp32_are_the_files_values_too(files, loaded, cache):
    path = files("llama", "Q5_K")
    model = engine(path, cache, weight_dtype="fp32").runner.model
    ref = loaded("llama", "Q5_K")[1]
    got = model.layers[0].mlp.down_proj.weight
    assert torch.equal(got, ref["model.layers.0.mlp.down_proj.weight"])


def test_row_reads_are_the_files_bytes(files):
    import gguf

    path = files("llama", "Q4_K_M")
    checkpoint = GGUFCheckpoint(path, load_config_for(path))
    tensor = checkpoint.tensor("model.layers.1.mlp.down_proj.weight")
    reader = {t.name: t for t in gguf.GGUFReader(path).tensors}["blk.1.ffn_down.weight"]
    assert np.array_equal(tensor.raw(3, 9), np.asarray(reader.data)[3:9])


def load_config_for(path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)


def test_weights_prepared_ahead_are_what_an_engine_maps(files, tmp_path):
    """docker's init stores the weights before web and workers start: an engine then
    maps that file rather than building its own."""
    path = files("llama", "Q4_K_M")
    stored = file_weights.prepare(str(path), None, str(tmp_path))
    assert stored is not None and stored.exists()
    before = stored.stat().st_mtime_ns
    eng = engine(path, tmp_path)
    assert stored.stat().st_mtime_ns == before and list(tmp_path.glob("*.pt")) == [stored]
    assert eng.generate([PROMPT], SamplingParams(max_tokens=2, temperature=0))[0][0].token_ids
