"""The quantization quality benchmark runs end to end and writes its JSON."""

import json

from bench import quant_quality


def test_bench_quant_quality_writes_every_measure(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXCHAT_MODEL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "qq.json"
    quant_quality.main(["--model", str(tiny_model), "--new-tokens", "4", "--out", str(out)])
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"fp32", "int8", "int4"}
    for r in data["results"].values():
        assert 0 <= r["free"] <= 1 and 0 <= r["forced"] <= 1
        assert r["kl"] >= -1e-9 and r["log_prob_change"] >= 0
        assert len(r["first_difference"]) == len(quant_quality.PROMPTS)
