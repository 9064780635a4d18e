"""Compile every Triton kernel ahead of time for CUDA GPUs, on a machine without one:

    python -m kernels.triton_aot [--arch 80 90] [--quick] [--out bench-results/triton-aot.json]

Each kernel goes through Triton's whole pipeline (TTIR, TTGIR, LLVM IR, PTX) and
ptxas into a cubin, for the dtypes and shapes the engine launches. The interpreter
tests (TRITON_INTERPRET=1) check what the kernels compute; this checks that they
lower for real GPUs, which the interpreter doesn't (tl.dot's operand sizes, layouts,
shared memory). Running them on a GPU is `python -m bench kernels-cuda`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class AttentionCase:
    group: int  # query heads per KV head
    head_dim: int
    block_size: int = 16
    block_m: int = 16


# SmolLM2 (3 KV heads of 64, GQA 3), Llama/Qwen-like 128 without GQA, and a head_dim
# that is not a power of two.
ATTENTION_CASES = [AttentionCase(3, 64), AttentionCase(1, 128), AttentionCase(4, 80)]
STORE_WIDTHS = [192, 1024]  # kv_heads * head_dim: SmolLM2's, and a power of two


def _jit(kernel):
    """The JITFunction behind a kernel, whichever mode it was defined in."""
    from triton.runtime.jit import JITFunction

    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)


def _compile(kernel, types: list[str], constexprs: dict, arch: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _jit(kernel)
    names = list(fn.arg_names)
    signature = dict(zip(names, types + ["constexpr"] * len(constexprs), strict=True))
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32))


def compile_all(archs: list[int], dtypes: list[str], attention_cases, store_widths) -> list[dict]:
    import triton

    from kernels import triton_attention as ta

    results = []
    for arch in archs:
        for dtype in dtypes:
            t = DTYPES[dtype]
            for width in store_widths:
                types = [f"*{t}"] * 4 + ["*i64", "i32", "i32"]
                constexprs = {"D": width, "BLOCK_D": triton.next_power_of_2(width)}
                shape = {"D": width}
                kernel = ta._store_kv_kernel
                results.append(_result("store_kv", kernel, arch, dtype, shape, types, constexprs))
            for case in attention_cases:
                types = [f"*{t}"] * 4 + ["*i32"] * 3 + ["fp32"] + ["i32"] * 8
                constexprs = {
                    "GROUP": case.group,
                    "BLOCK_M": case.block_m,
                    "BLOCK_SIZE": case.block_size,
                    "HEAD_DIM": case.head_dim,
                    "BLOCK_D": triton.next_power_of_2(case.head_dim),
                }
                kernel, shape = ta._paged_attention_kernel, asdict(case)
                results.append(
                    _result("paged_attention", kernel, arch, dtype, shape, types, constexprs)
                )
    return results


def _result(name: str, kernel, arch: int, dtype: str, shape: dict, types, constexprs) -> dict:
    start = time.perf_counter()
    compiled = _compile(kernel, types, constexprs, arch)
    return {
        "kernel": name,
        "arch": f"sm_{arch}",
        "dtype": dtype,
        "shape": shape,
        "cubin_bytes": len(compiled.asm["cubin"]),
        "shared_bytes": compiled.metadata.shared,
        "seconds": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--arch", type=int, nargs="+", default=[80, 90], help="compute capabilities"
    )
    parser.add_argument("--quick", action="store_true", help="bf16 and SmolLM2's shapes only")
    parser.add_argument("--out", default="bench-results/triton-aot.json")
    args = parser.parse_args(argv)
    # Kernels defined under the interpreter can't be compiled: define them natively.
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("unset TRITON_INTERPRET: interpreted kernels don't compile")
    if args.quick:
        results = compile_all(args.arch, ["bfloat16"], ATTENTION_CASES[:1], STORE_WIDTHS[:1])
    else:
        results = compile_all(args.arch, list(DTYPES), ATTENTION_CASES, STORE_WIDTHS)
    for r in results:
        print(
            f"{r['kernel']:16s} {r['arch']} {r['dtype']:9s} {json.dumps(r['shape']):60s} "
            f"cubin {r['cubin_bytes']:6d} B  shared {r['shared_bytes']:6d} B  {r['seconds']:.1f} s"
        )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
