"""The fp32 prefill benchmark runs end to end and writes its JSON (figures unchecked),
and puts the engine's kernel choices back."""

import json

import pytest

from bench import prefill_cpu
from kernels import attention, c_build
from kernels import quant_linear as ql


@pytest.mark.model
@pytest.mark.skipif(c_build.compiler() is None, reason="needs a C compiler")
def test_bench_prefill_cpu_writes_every_case(tmp_path, monkeypatch):
    monkeypatch.setattr(prefill_cpu, "SHAPES", [(32, 64)])
    choose, runs = ql.prefill_gemm, attention.own_prefill_runs
    out = tmp_path / "p.json"
    prefill_cpu.main(["--out", str(out), "--rounds", "1", "--iters", "1", "--tokens", "40"])
    data = json.loads(out.read_text())
    assert [c["case"] for c in data["kernels"]] == [
        "gemm uint8 32x64", "gemm int4 32x64", "attention 40"]
    assert [c["case"] for c in data["prefills"]] == [
        f"{wd}, {name}" for wd in ("int8", "int4") for name in prefill_cpu.CHOICES]
    assert all(c["own_ms"] > 0 and c["torch_ms"] > 0 for c in data["kernels"])
    assert all(c["median_ms"] > 0 for c in data["prefills"])
    assert data["defaults"]["gemm"] in ("own", "torch")
    assert (ql.prefill_gemm, attention.own_prefill_runs) == (choose, runs)
