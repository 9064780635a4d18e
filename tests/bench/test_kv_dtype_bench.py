"""The KV dtype benchmark runs end to end and writes its JSON (figures unchecked)."""

import json

from bench import kv_dtype
from kernels.cpu_features import cpu_path


def test_bench_kv_dtype_writes_a_rate_per_engine_and_context(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXCHAT_MODEL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "kv.json"
    kv_dtype.main(["--model", str(tiny_model), "--weight-dtypes", "int4", "--contexts", "8,40",
                   "--new-tokens", "4", "--rounds", "2", "--out", str(out)])
    data = json.loads(out.read_text())
    # An fp32 path measures fp32, bf16 and int8 K/V; the bf16 path keeps bf16 alone.
    fp32_path = cpu_path() != "avx512-bf16"
    kinds = {"float32", "bfloat16", "int8"} if fp32_path else {"bfloat16"}
    rows = {(r["kv_dtype"], r["context"]): r for r in data["results"]}
    assert set(rows) == {(k, n) for k in kinds for n in (8, 40)}
    assert all(len(r["rounds"]) == 2 and r["decode_tokens_per_s"] > 0 for r in rows.values())
    per_token = {k: rows[(k, 8)]["kv_bytes_per_token"] for k in kinds}
    if fp32_path:
        assert per_token["float32"] == 2 * per_token["bfloat16"]
        # A row of head_dim int8 values carries its 4-byte scale (the tiny model's
        # heads are 16 wide).
        assert per_token["int8"] * 2 * 16 == per_token["bfloat16"] * (16 + 4)
