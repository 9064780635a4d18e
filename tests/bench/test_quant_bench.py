"""The quantization benchmark runs end to end and writes its JSON (figures unchecked)."""

import json

from bench import quant


def test_bench_quant_writes_every_figure(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXCHAT_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(quant, "SHAPES", [(64, 100)])
    monkeypatch.setattr(quant, "ROWS", (1, 3))
    out = tmp_path / "q.json"
    quant.main(["--model", str(tiny_model), "--rounds", "2", "--new-tokens", "4",
                "--iters", "1", "--prefill-tokens", "40", "--out", str(out)])
    data = json.loads(out.read_text())
    for key in ("decode_tokens_per_s", "prefill_tokens_per_s", "weight_bytes"):
        assert set(data[key]) == {"bf16", "int8", "int4"}
    assert all(len(v) == 2 for v in data["decode_tokens_per_s_rounds"].values())
    assert data["weight_bytes"]["int4"] < data["weight_bytes"]["int8"] < data["weight_bytes"]["bf16"]
    assert set(data["per_call_us"]) == {"64->100 x1", "64->100 x3"}
    for paths in data["per_call_us"].values():
        assert {"bf16", "int8-dequant", "int4-dequant"} <= set(paths)
        assert all(t > 0 for t in paths.values())
