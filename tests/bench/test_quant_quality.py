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


def test_against_torchs_fp32_forward_each_kind_runs_on_this_path(tiny_model, tmp_path,
                                                                  monkeypatch):
    """--reference torch-fp32: the reference is torch's forward with no C kernel, and
    the fp32 engine on fp32 weights (the C decode step where it runs) agrees with it."""
    from kernels import f32_kernels
    from kernels.cpu_features import cpu_path

    monkeypatch.setenv("PREFIXCHAT_MODEL_CACHE", str(tmp_path / "cache"))
    calls = []
    original = f32_kernels.available

    def counted():
        calls.append(1)
        return original()

    monkeypatch.setattr(f32_kernels, "available", counted)
    out = tmp_path / "qq.json"
    quant_quality.main(["--model", str(tiny_model), "--new-tokens", "4", "--kinds", "fp32,bf16",
                        "--reference", "torch-fp32", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["reference"] == "torch-fp32" and data["cpu_path"] == cpu_path()
    assert data["results"]["fp32"]["forced"] == 1.0 and data["results"]["fp32"]["kl"] < 1e-6
    assert calls  # the engines under test asked for the kernels
