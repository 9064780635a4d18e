"""GGUF tensors on our quantized layouts: small GGUF files written with gguf's own
writer and quantizers (random blocks for the k-quants, which gguf cannot quantize),
read back and held to gguf's dequantizers."""

from __future__ import annotations

import os
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from bench.random_gguf import random_blocks
from inference import gguf_weights as gw
from inference import loader
from inference.gguf_checkpoint import FileTensor
from inference.gguf_file import GGUFFile
from kernels.quant_linear import dequantize, quantize

ROWS, COLS = 24, 512  # 512 columns: two k-quant super-blocks a row


def write_gguf(path, tensors: dict[str, tuple[np.ndarray, T | None]]) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def weights(rng: np.random.Generator, rows: int = ROWS, cols: int = COLS) -> np.ndarray:
    # Lopsided groups (a mean per row) as real weights have, so no grid is symmetric.
    return (rng.standard_normal((rows, cols)) * 0.05 + rng.normal(0, 0.02, (rows, 1))).astype(np.float32)


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    """One tensor of every type we read, quantized by gguf where it can."""
    rng = np.random.default_rng(0)
    tensors: dict[str, tuple[np.ndarray, T | None]] = {}
    for qtype in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.BF16):
        tensors[qtype.name] = (gguf.quants.quantize(weights(rng), qtype), qtype)
    for qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        tensors[qtype.name] = (random_blocks(qtype, ROWS, COLS, rng), qtype)
    tensors["F16"] = (weights(rng).astype(np.float16), None)
    tensors["F32"] = (weights(rng), None)
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    write_gguf(path, tensors)
    return path


def reader_tensors(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def test_every_type_reads_as_ggufs_dequantizer_gives_it(small_gguf):
    tensors = reader_tensors(small_gguf)
    assert {t.tensor_type.name for t in tensors.values()} == set(tensors)
    for name, t in tensors.items():
        values = gw.dequantize_tensor(t)
        assert values.shape == (ROWS, COLS), name
        assert values.dtype == np.float32 and np.isfinite(values).all(), name
    f16 = tensors["F16"]
    assert np.array_equal(gw.dequantize_tensor(f16), np.asarray(f16.data, np.float32))


@pytest.mark.parametrize("qtype", list(gw.NATIVE_KINDS), ids=lambda t: t.name)
def test_affine_rows_are_the_tensor_bit_for_bit(small_gguf, qtype):
    t = reader_tensors(small_gguf)[qtype.name]
    rows = gw.affine_rows(np.asarray(t.data), t.tensor_type, COLS)
    assert rows is not None
    assert np.array_equal(rows.values(), gw.dequantize_tensor(t))


def test_types_without_an_affine_form_have_none(small_gguf):
    t = reader_tensors(small_gguf)["Q6_K"]
    assert gw.affine_rows(np.asarray(t.data), t.tensor_type, COLS) is None


@pytest.mark.parametrize("qtype", list(gw.NATIVE_KINDS), ids=lambda t: t.name)
@pytest.mark.parametrize("kind", ["int8", "int4", "uint8"])
def test_native_rows_on_our_grids(small_gguf, qtype, kind):
    """Each type our kinds hold: exact for Q8_0, Q4_0/Q4_1 and Q5_0/Q5_1 (uint8's Q8_0
    where k fits), within the fp16 rounding of d * sc and dmin * m for k-quants; the
    kinds that cannot hold a type refuse it."""
    t = reader_tensors(small_gguf)[qtype.name]
    rows = gw.affine_rows(np.asarray(t.data), t.tensor_type, COLS)
    qw = gw.to_kind(rows, kind)
    if kind not in gw.NATIVE_KINDS[qtype]:
        assert qw is None
        return
    assert qw is not None and qw.kind == kind and qw.in_features == COLS
    ours = dequantize(qw, torch.float32)
    want = torch.from_numpy(gw.dequantize_tensor(t))
    if qtype in gw.EXACT_TYPES and not (qtype == T.Q8_0 and kind == "uint8"):
        assert torch.equal(ours, want)
        return
    err = (ours - want).abs()
    bound = gw.rounding_bound(qw)
    assert bool((err <= bound).all()), float((err / bound).max())
    # That is about 2^-11 of a group's span, from the file's own scales: far below
    # the type's step.
    step, offset = (torch.from_numpy(x).repeat_interleave(32, dim=1) for x in (rows.step, rows.offset))
    levels = 15 if kind == "int4" else 255
    assert bool((err <= 2.0**-10 * (levels * step + offset.abs()) + 2.0**-23).all())


@pytest.mark.parametrize(("qtype", "kind"), [(T.Q8_0, "int8"), (T.Q4_K, "int4")],
                         ids=lambda x: getattr(x, "name", x))
def test_types_stored_in_their_own_bytes_are_what_unpacking_gives(small_gguf, qtype, kind):
    t = reader_tensors(small_gguf)[qtype.name]
    raw = np.asarray(t.data)
    fast = gw.same_bytes(raw, qtype, kind, COLS)
    slow = gw.to_kind(gw.affine_rows(raw, qtype, COLS), kind)
    assert fast is not None and fast.kind == slow.kind
    assert torch.equal(fast.data, slow.data) and torch.equal(fast.scale, slow.scale)
    assert gw.same_bytes(raw, qtype, "uint8", COLS) is None


def test_k_quant_scales_that_fit_fp16_load_exactly(tmp_path):
    """A Q4_K sub-block whose d * sc and dmin * m are fp16 values (d, dmin powers of 2)
    comes back bit for bit: the only loss is that rounding."""
    rng = np.random.default_rng(1)
    raw = random_blocks(T.Q4_K, ROWS, COLS, rng).reshape(-1, 144)
    raw[:, 0:2] = np.full((len(raw), 1), 2.0**-10, np.float16).view(np.uint8)
    raw[:, 2:4] = np.full((len(raw), 1), 2.0**-9, np.float16).view(np.uint8)
    path = tmp_path / "pow2.gguf"
    write_gguf(path, {"w": (raw.reshape(ROWS, -1), T.Q4_K)})
    t = reader_tensors(path)["w"]
    rows = gw.affine_rows(np.asarray(t.data), t.tensor_type, COLS)
    for kind in ("int4", "uint8"):
        qw = gw.to_kind(rows, kind)
        assert torch.equal(dequantize(qw), torch.from_numpy(gw.dequantize_tensor(t)))


def test_requantizing_k_quant_values_moves_them_more_than_native_rows(small_gguf):
    """Why rows come from the file's blocks: quantizing the dequantized values again
    puts a sub-block that spans less than its 16 levels on another grid."""
    t = reader_tensors(small_gguf)["Q4_K"]
    want = torch.from_numpy(gw.dequantize_tensor(t))
    native = gw.to_kind(gw.affine_rows(np.asarray(t.data), t.tensor_type, COLS), "int4")
    again = quantize(want, "int4")
    native_err = (dequantize(native) - want).abs().max()
    again_err = (dequantize(again) - want).abs().max()
    assert again_err > 10 * native_err


def file_tensor(path, name: str, perm=None) -> FileTensor:
    fd = os.open(path, os.O_RDONLY)
    tensor = next(t for t in GGUFFile(path).tensors if t.name == name)
    return FileTensor(tensor, fd, perm)


def test_a_layer_stacks_its_parts_on_their_blocks_in_transformers_row_order(small_gguf):
    """A fused layer (q/k/v, gate/up) takes each part's rows from its blocks, a
    permuted part (Llama's q and k) in transformers' order."""
    tensors = reader_tensors(small_gguf)
    perm = np.arange(ROWS)[::-1].copy()
    parts = [file_tensor(small_gguf, "Q4_0", perm), file_tensor(small_gguf, "Q4_1")]
    qw, native = gw.stored_weight(parts, "int4")
    assert native == 2 * ROWS and qw.kind == "int4" and qw.out_features == 2 * ROWS
    want = np.concatenate([gw.dequantize_tensor(tensors["Q4_0"])[perm],
                           gw.dequantize_tensor(tensors["Q4_1"])])
    assert torch.equal(dequantize(qw), torch.from_numpy(want))


def test_a_layer_takes_the_first_kind_that_holds_all_its_parts(small_gguf):
    """Q8_0 beside Q4_1 under int4: int4 holds Q4_1 only, int8 Q8_0 only, so both go
    to uint8 (8 bits with an offset); Q8_0 alone goes to int8, exactly."""
    qw, native = gw.stored_weight([file_tensor(small_gguf, "Q4_1"),
                                   file_tensor(small_gguf, "Q8_0")], "int4")
    assert native == 2 * ROWS and qw.kind == "uint8"
    qw, native = gw.stored_weight([file_tensor(small_gguf, "Q8_0")], "int4")
    assert native == ROWS and qw.kind == "int8"


def test_a_part_no_kind_holds_puts_the_layer_on_8_bits_again(small_gguf):
    """Q6_K has no form on our grids: its rows are quantized again from the file's
    values, onto 8 bits with an offset (never onto int4, which would drop 2 bits), and
    the Q4_K part beside it keeps its blocks on that grid."""
    tensors = reader_tensors(small_gguf)
    qw, native = gw.stored_weight([file_tensor(small_gguf, "Q4_K"),
                                   file_tensor(small_gguf, "Q6_K")], "int4")
    assert native == ROWS and qw.kind == "uint8"
    q4k = gw.to_kind(gw.affine_rows(np.asarray(tensors["Q4_K"].data), T.Q4_K, COLS), "uint8")
    q6k = torch.from_numpy(gw.dequantize_tensor(tensors["Q6_K"]))
    assert torch.equal(dequantize(qw)[:ROWS], dequantize(q4k))
    assert torch.equal(dequantize(qw)[ROWS:], dequantize(quantize(q6k, "uint8")))


def test_auto_reads_a_converted_folders_gguf(small_gguf, tmp_path):
    folder = tmp_path / "converted"
    folder.mkdir()
    gw.write_source_record(folder, small_gguf)
    assert loader.auto_weight_dtype("unused-name", folder) == "bf16"  # no blk.* matrices


def test_a_packaged_model_without_its_package_says_how_to_install_it(monkeypatch, tmp_path):
    from inference import gguf_models

    entry = gguf_models.PACKAGED["gemma3-270m"]
    monkeypatch.setitem(gguf_models.PACKAGED, "gemma3-270m",
                        gguf_models.PackagedGGUF(entry.name, "no_such_package_here",
                                                 entry.distribution, entry.make_target))
    with pytest.raises(loader.ModelNotFoundError, match="make install-gemma3"):
        loader.resolve_model_path("gemma3-270m", str(tmp_path))
    assert loader.gemma3_gguf_path(str(tmp_path)) is None


def test_the_loader_takes_gemma3_configs(tmp_path):
    from transformers import Gemma3TextConfig

    Gemma3TextConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                     vocab_size=128).save_pretrained(tmp_path)
    assert {"gemma3", "gemma3_text"} <= set(loader.SUPPORTED_ARCHITECTURES)
    assert loader.load_config(tmp_path).model_type == "gemma3_text"


def test_the_shipped_smollm2_rows_are_the_same_bytes_either_way():
    """SmolLM2's Q4_1 layers and Q8_0 head: taken from the file or quantized again from
    their values, the same bytes under int4 and uint8 (and int8 for the head), so
    a converted folder that names its GGUF changes nothing for the default model."""
    tensors = [t for t in GGUFFile(loader.smollm2_gguf_path()).tensors
               if len(t.shape) == 2 and t.name.startswith(("blk.0.", "token_embd"))]
    assert {t.tensor_type for t in tensors} == {T.Q4_1, T.Q8_0}
    for t in tensors:
        some = slice(0, 1024)  # of the head's 49152 rows too
        rows = gw.affine_rows(np.asarray(t.data)[some], t.tensor_type, int(t.shape[0]))
        values = torch.from_numpy(gw.dequantize_tensor(t, some))
        kinds = ("int8",) if t.tensor_type == T.Q8_0 else ("int4", "uint8")
        for kind in kinds:
            native, again = gw.to_kind(rows, kind), quantize(values, kind)
            assert torch.equal(native.data, again.data) and torch.equal(native.scale, again.scale)


def test_gemma_replies_end_at_end_of_turn_too():
    from inference.gguf_models import eos_token_ids

    vocab = {"<end_of_turn>": 106, "<unk>": 3}
    tok = SimpleNamespace(unk_token_id=3, convert_tokens_to_ids=lambda t: vocab.get(t, 3))
    assert eos_token_ids("gemma3", 1, tok) == [1, 106]
    assert eos_token_ids("gemma3", [1, 106], tok) == [1, 106]
    assert eos_token_ids("llama", 2, tok) == 2
    vocab.pop("<end_of_turn>")
    assert eos_token_ids("gemma3", 1, tok) == 1
