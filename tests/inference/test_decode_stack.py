"""The whole decode step as one C call (kernels.decode_stack): when the engine takes
it, and that it computes what the torch forward computes."""

from __future__ import annotations

import pytest
import torch

from bench import quant_quality as quality
from inference import EngineConfig, LLMEngine
from inference.models.llama import Linear
from kernels import cpu_kernels, kv_quant
from kernels.c_build import compiler
from kernels.cpu_features import cpu_path
from kernels.decode_stack import DecodeStack, StackLayer

pytestmark = pytest.mark.skipif(compiler() is None, reason="needs a C compiler")

# The step's dtypes this host's path runs: fp32 on every path, bf16 on avx512-bf16.
BF16_HERE = cpu_path() == "avx512-bf16"
STEP_DTYPES = ["float32", "bfloat16"] if BF16_HERE else ["float32"]
# Weight dtypes each step reads: stored (quantized, bf16 in an fp32 step) or plain.
STEP_WEIGHTS = {"bfloat16": ["int8", "int4", "bf16"], "float32": ["int8", "int4", "bf16", "fp32"]}
CASES = [(d, w) for d in STEP_DTYPES for w in STEP_WEIGHTS[d]]
# The fp32 step's KV caches: "auto" (int8 rows under compact weights, fp32 under fp32
# ones) and each dtype set against the grain.
KV_CASES = [(d, w, "auto") for d, w in CASES] + [
    ("float32", "int4", "float32"), ("float32", "int4", "bfloat16"),
    ("float32", "fp32", "bfloat16"), ("float32", "fp32", "int8")]
needs_bf16 = pytest.mark.skipif(not BF16_HERE, reason="the bf16 step is avx512-bf16's")

PROMPTS = [[5, 17, 300, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23],
           [1000, 2000, 3000]]


def engine(model, tmp_path, weight_dtype="int8", dtype="bfloat16", **kw) -> LLMEngine:
    kw.setdefault("num_blocks", 64)
    return LLMEngine(EngineConfig(model=str(model), dtype=dtype, block_size=4,
                                  weight_dtype=weight_dtype, model_cache_dir=str(tmp_path), **kw))


def test_the_step_is_built_in_the_dtypes_this_path_runs(tiny_model, tmp_path):
    for dtype, weight_dtype in CASES:
        eng = engine(tiny_model, tmp_path, weight_dtype, dtype=dtype)
        assert eng.runner.model.decode_stack is not None, (dtype, weight_dtype)
        assert eng.cpu_path == cpu_path()
    if not BF16_HERE:  # bf16 activations take torch's ops off avx512-bf16
        assert engine(tiny_model, tmp_path, "int8").runner.model.decode_stack is None
        return
    # bf16 weights are kept plain beside their packed copies: widths of 64s only
    plain = engine(tiny_model, tmp_path, "bf16").runner.model.layers[0].mlp.down_proj
    assert plain.keeps_plain and plain.packed is not None and plain.weight.shape == (64, 128)
    odd = Linear(48, 64, bias=False).to(torch.bfloat16)
    assert not odd.takes_plain_rows() and not odd.keeps_plain


@needs_bf16
def test_a_tied_head_takes_a_few_rows_through_the_embedding_table_in_c(tiny_model, tmp_path):
    """A bf16 engine's tied head keeps the embedding table as its plain weight (no
    copy), and a few rows multiply it in C, as a quantized head's rows are multiplied;
    an untied head keeps only its packed copy."""
    from tests.inference.conftest import make_tiny_model

    model = engine(tiny_model, tmp_path, "bf16").runner.model
    head = model.lm_head
    assert model.tie_word_embeddings and head.keeps_plain and head.packed is not None
    assert head.weight is model.embed_tokens.weight
    h = torch.randn(3, head.in_features).bfloat16()
    want = cpu_kernels.bf16_matmul(h, model.embed_tokens.weight)
    assert torch.equal(model.compute_logits(h), want)
    untied = engine(make_tiny_model(tmp_path / "untied", tied=False, seed=2), tmp_path, "bf16")
    assert not untied.runner.model.lm_head.keeps_plain


def one_decode_step(eng: LLMEngine, use_stack: bool):
    """Hidden states and caches after one decode step of every running sequence,
    from the same starting caches."""
    runner, model = eng.runner, eng.runner.model
    seqs = list(eng.scheduler.running)
    assert seqs and all(s.num_computed_tokens == s.num_tokens - 1 for s in seqs)
    saved, stack = runner.kv_cache.clone(), model.decode_stack
    if not use_stack:
        model.decode_stack = None
    try:
        with torch.inference_mode():
            ids, pos, meta, _ = runner.prepare(seqs, [1] * len(seqs))
            hidden = model(ids, pos, runner.kv_cache, meta)
        return hidden, runner.kv_cache.clone()
    finally:
        model.decode_stack = stack
        runner.kv_cache.copy_(saved)


@pytest.mark.parametrize("model_name", ["tiny_model", "tiny_qwen2"])
@pytest.mark.parametrize(("dtype", "weight_dtype", "kv_dtype"), KV_CASES)
def test_a_decode_step_computes_what_the_torch_forward_does(
    request, tmp_path, model_name, dtype, weight_dtype, kv_dtype
):
    eng = engine(request.getfixturevalue(model_name), tmp_path, weight_dtype, dtype=dtype,
                 kv_dtype=kv_dtype)
    compact = weight_dtype != "fp32" and dtype == "float32"
    auto = kv_quant.POOL_DTYPE if compact else getattr(torch, dtype)
    want_kv = (auto if kv_dtype == "auto" else kv_quant.POOL_DTYPE if kv_dtype == "int8"
               else getattr(torch, kv_dtype))
    assert eng.runner.kv_cache.dtype == want_kv
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", p, quality.greedy(8))
    for _ in range(3):  # prefills, then decodes over several blocks of 4
        eng.step()
    h_stack, kv_stack = one_decode_step(eng, use_stack=True)
    h_torch, kv_torch = one_decode_step(eng, use_stack=False)
    assert not torch.equal(kv_stack, eng.runner.kv_cache)  # the step stored its K/V
    if want_kv == kv_quant.POOL_DTYPE:
        # fp32 K/V that agree to about 1e-5, quantized alike (kv_quant, bit for bit in
        # the C store): the same rows but where a value lies by a rounding edge (one step
        # apart).
        stack, torch_rows = kv_quant.dequantize(kv_stack), kv_quant.dequantize(kv_torch)
        assert (kv_stack != kv_torch).float().mean() < 0.01
        step = stack.abs().amax(-1, keepdim=True) / 127
        assert ((stack - torch_rows).abs() <= step * 1.01 + 1e-6).all()
        torch.testing.assert_close(h_stack, h_torch, rtol=1e-3, atol=1e-3)
        return
    if dtype == "float32" and want_kv == torch.bfloat16:
        # fp32 K/V that agree to about 1e-5, rounded to bf16: equal but where one lies
        # by a rounding edge (one bf16 step apart); the attention widens them alike.
        assert (kv_stack != kv_torch).float().mean() < 0.01
        torch.testing.assert_close(kv_stack.float(), kv_torch.float(), rtol=2**-7, atol=1e-5)
        torch.testing.assert_close(h_stack, h_torch, rtol=1e-3, atol=1e-3)
        return
    if dtype == "float32":
        # The same ops in fp32, their sums in another order.
        torch.testing.assert_close(kv_stack, kv_torch, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(h_stack, h_torch, rtol=1e-4, atol=1e-4)
        return
    # Same ops with the same bf16 roundings: equal but for a rare last-bit difference
    # of silu's exp, which later layers carry on.
    assert (kv_stack != kv_torch).float().mean() < 0.01
    torch.testing.assert_close(h_stack.float(), h_torch.float(), rtol=0.02, atol=0.02)


@pytest.mark.parametrize(("dtype", "weight_dtype"),
                         [c for c in CASES if c[1] in ("int4", "bf16")])
def test_replies_are_the_torch_forwards_and_only_small_batches_take_the_step(
    tiny_model, tmp_path, monkeypatch, dtype, weight_dtype
):
    eng = engine(tiny_model, tmp_path, weight_dtype, dtype=dtype, num_blocks=256, max_num_seqs=40)
    stack = eng.runner.model.decode_stack
    calls = []
    original = DecodeStack.__call__

    def counted(self, x, *args):
        calls.append(x.shape[0])
        return original(self, x, *args)

    monkeypatch.setattr(DecodeStack, "__call__", counted)
    many = [[i + 5, 2 * i + 9, 3 * i + 11] for i in range(stack.max_rows + 1)]
    with_stack = quality.replies(eng, PROMPTS, 12), quality.replies(eng, many, 6)
    # Three sequences decode as one call; one more than max_rows is more than it takes
    # (fewer, as the batch's replies end, take it again).
    assert 3 in calls and max(calls) <= stack.max_rows
    n_calls = len(calls)
    eng.runner.model.decode_stack = None
    eng.reset_prefix_cache()  # the prompts are computed again, as the first time
    without = quality.replies(eng, PROMPTS, 12), quality.replies(eng, many, 6)
    assert with_stack == without
    assert len(calls) == n_calls  # no call without the stack
    eng.runner.model.decode_stack = stack


@pytest.mark.parametrize("dtype", STEP_DTYPES)
def test_bad_inputs_are_refused(tiny_model, tmp_path, dtype):
    eng = engine(tiny_model, tmp_path, "int8", dtype=dtype)
    stack = eng.runner.model.decode_stack
    kv = eng.runner.kv_cache
    hidden, head_dim = stack.hidden, stack.head_dim
    step = getattr(torch, dtype)
    # A cache the step does not read (the fp32 step reads fp32 and bf16 ones).
    other = torch.float32 if step == torch.bfloat16 else torch.float16
    x = torch.zeros(2, hidden, dtype=step)
    cos = torch.ones(2, head_dim, dtype=step)
    sin = torch.zeros(2, head_dim, dtype=step)
    slots = torch.tensor([0, 1])
    tables = torch.tensor([[0], [1]])
    lens = torch.tensor([1, 1])
    assert stack(x.clone(), cos, sin, slots, kv, tables, lens).shape == (2, hidden)
    bad = {
        "x in another dtype": (x.to(other), cos, sin, slots, kv, tables, lens),
        "cos of other rows": (x, cos[:1], sin, slots, kv, tables, lens),
        "int32 slots": (x, cos, sin, slots.int(), kv, tables, lens),
        "slot past the cache": (x, cos, sin, torch.tensor([0, kv[0, 0].numel()]), kv, tables, lens),
        "block past the cache": (x, cos, sin, slots, kv, torch.tensor([[0], [10**6]]), lens),
        "table too short": (x, cos, sin, slots, kv, tables, torch.tensor([1, 5])),
        "negative block": (x, cos, sin, slots, kv, torch.tensor([[0], [-1]]), lens),
        "empty context": (x, cos, sin, slots, kv, tables, torch.tensor([1, 0])),
        "nine rows": (torch.zeros(9, hidden, dtype=step),) * 1
        + (cos, sin, slots, kv, tables, lens),
        "cache in another dtype": (x, cos, sin, slots, kv.to(other), tables, lens),
    }
    for name, args in bad.items():
        with pytest.raises(ValueError):
            stack(*args)
            pytest.fail(name)
    layer = eng.runner.model.layers[0]
    parts = StackLayer(layer.input_layernorm.weight.data, layer.post_attention_layernorm.weight.data,
                       layer.self_attn.qkv_proj.quantized, layer.mlp.down_proj.quantized,
                       layer.mlp.gate_up_proj.quantized, layer.mlp.down_proj.quantized)
    with pytest.raises(ValueError, match="o is"):
        DecodeStack([parts], eng.runner.model.norm.weight.data, 4, 2, head_dim, 1e-5)
    with pytest.raises(ValueError, match="heads"):
        DecodeStack([parts], eng.runner.model.norm.weight.data, 4, 2, 20, 1e-5)
