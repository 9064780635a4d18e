"""The CPU kernel benchmark runs end to end and writes its JSON (figures unchecked)."""

import json

import pytest

from bench import kernels_cpu as bench_cpu
from kernels import cpu_kernels


@pytest.mark.skipif(not cpu_kernels.available(), reason="needs AVX512-BF16 and a C compiler")
def test_bench_cpu_writes_every_case(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_cpu, "DECODE_CASES", [(2, 20)])
    monkeypatch.setattr(bench_cpu, "SOFTMAX_CASES", [(5, 40)])
    monkeypatch.setattr(bench_cpu, "RMS_NORM_CASES", [(3, 64)])
    out = tmp_path / "k.json"
    bench_cpu.main(["--out", str(out), "--rounds", "2", "--iters", "1"])
    data = json.loads(out.read_text())
    assert data["rounds"] == 2
    assert [c["case"] for c in data["cases"]] == ["decode 2x20", "softmax 5x40", "rms_norm 3x64"]
    for case in data["cases"]:
        assert case["c_us"] > 0 and case["torch_us"] > 0 and case["speedup"] > 0
    # The timed torch side really was the gather + flash path, and it was put back.
    assert cpu_kernels.runs_decode.__name__ == "runs_decode"
