"""`python -m bench kernels-cuda`, the GPU timing script, run end to end on the CPU with
Triton interpreted: every case is timed and checked against the reference."""

import json

import pytest
import torch

pytest.importorskip("triton")

from bench import kernels_cuda as bench  # noqa: E402


def test_the_gpu_script_runs_every_case_on_the_cpu(tmp_path):
    out = tmp_path / "kernels.json"
    result = bench.main(["--device", "cpu", "--quick", "--skip-tests", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["device"] == "cpu" and "kernel_tests_passed" not in result
    cases = result["cases"]
    assert [(c["case"], c["dtype"]) for c in cases] == [
        (name, dtype) for name, *_ in bench.QUICK_CASES for dtype in ("bfloat16", "float16")
    ]
    for c in cases:
        assert c["triton_ms"] > 0 and c["reference_ms"] > 0 and c["sdpa_gathered_ms"] > 0
        # Triton and SDPA on gathered K/V both agree with the reference.
        assert c["triton_max_abs_diff"] < 3e-2, c
        assert c["sdpa_gathered_max_abs_diff"] < 3e-2, c


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_the_default_device_is_refused():
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench.main(["--skip-tests"])
