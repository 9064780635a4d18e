"""Build llama.cpp's `llama-server` from source, and make the GGUF files it serves.

The source is the llama.cpp tree vendored in the `llama-cpp-python` sdist (PyPI is
the one place this machine reaches), fetched with pip, unpacked and built with CMake
into a cache folder outside the repository:

    <cache>/<version>/src/                the unpacked sdist (vendor/llama.cpp inside)
    <cache>/<version>/build/bin/          llama-server, llama-quantize and their .so files
    <cache>/<version>/build/BUILT         written last: the version and the CMake flags
    <cache>/<version>/build-avx2/         the same for `--isa avx2` (its own bin/ and BUILT)
    <cache>/models/                       GGUF files made by llama-quantize (shared by both)

Two instruction sets: `native` (-DGGML_NATIVE=ON: whatever this CPU has, AVX512 where
it has it) and `avx2` (AVX2/FMA/F16C/BMI2 only), the llama.cpp to set against our
engine's forced AVX2 path (PREFIXCHAT_CPU_PATH=avx2) on an AVX512 host.

The cache is $PREFIXCHAT_LLAMACPP_CACHE, else $XDG_CACHE_HOME (or ~/.cache)/prefixchat/
llama.cpp. A build whose BUILT stamp matches the version and flags, and whose binaries
exist, is not redone. The binaries run in place (their shared libraries lie beside them).

GGUF files: the default model ships only as Q4_1. Q8_0 and BF16 are made from that
same file by `llama-quantize --allow-requantize`, which de-quantises each tensor to
f32 and quantises it once: the weights our engine loads (the safetensors de-quantised
from the same Q4_1) and llama.cpp's come from one source with one rounding each.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bench.report import progress_log

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
ISAS = ("native", "avx2")
_COMMON_FLAGS = (
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)
# The native build's flags, in the order its BUILT stamps hold them (a reorder would
# make an existing build look stale).
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    *_COMMON_FLAGS,
    # ggml's AMX path (chosen by -march=native where the CPU lists AMX) dies in ldtilecfg
    # inside this workplace's VMs (SIGSEGV / SIGILL at the first matmul): leave it out.
    # llama.cpp then runs its AVX512 (VNNI, BF16) kernels.
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
)
# AVX2 only, whatever the host has: GGML_NATIVE=OFF stops -march=native, the ISA
# switches pick the AVX2 kernels and AVX512 stays off. AMX is off by default without
# -march=native, so the -mno-amx-* flags are not needed here.
AVX2_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DGGML_AVX512=OFF",
    *_COMMON_FLAGS,
)
TARGETS = ("llama-server", "llama-quantize")
STAMP = "BUILT"
# Types llama-quantize can make from the shipped Q4_1 file, by their GGUF names.
GGUF_TYPES = ("Q4_1", "Q8_0", "BF16", "F16")


log = progress_log("bench llamacpp", clock=False)


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Explicit override, $PREFIXCHAT_LLAMACPP_CACHE, else the XDG cache."""
    if override:
        return Path(override).expanduser()
    if env := os.environ.get("PREFIXCHAT_LLAMACPP_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "prefixchat" / "llama.cpp"


def version_dir(cache: Path, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return cache / version


def check_isa(isa: str) -> str:
    if isa not in ISAS:
        raise ValueError(f"unknown ISA {isa!r} (one of {', '.join(ISAS)})")
    return isa


def cmake_flags(isa: str = "native") -> tuple[str, ...]:
    """The CMake -D flags of an `isa` build."""
    return AVX2_CMAKE_FLAGS if check_isa(isa) == "avx2" else CMAKE_FLAGS


def build_dir(cache: Path, version: str = LLAMA_CPP_PYTHON_VERSION, isa: str = "native") -> Path:
    """`build` for native (where it always was, so existing builds stay valid), else
    `build-<isa>`: each ISA keeps its own tree and both can be kept."""
    name = "build" if check_isa(isa) == "native" else f"build-{isa}"
    return version_dir(cache, version) / name


def binary(
    cache: Path, name: str, version: str = LLAMA_CPP_PYTHON_VERSION, isa: str = "native"
) -> Path:
    return build_dir(cache, version, isa) / "bin" / name


def stamp_text(version: str, generator: str, isa: str = "native") -> str:
    """The BUILT stamp: version, generator, then the flags (which tell the ISAs apart)."""
    lines = [f"llama-cpp-python=={version}", f"generator={generator}", *cmake_flags(isa)]
    return "\n".join(lines) + "\n"


def generator() -> str:
    return "Ninja" if shutil.which("ninja") else "Unix Makefiles"


def is_built(cache: Path, version: str = LLAMA_CPP_PYTHON_VERSION, isa: str = "native") -> bool:
    """True when the stamp names this version and these flags and the binaries are there."""
    stamp = build_dir(cache, version, isa) / STAMP
    if not stamp.is_file():
        return False
    lines = stamp.read_text().splitlines()
    if (
        not lines
        or lines[0] != f"llama-cpp-python=={version}"
        or tuple(lines[2:]) != cmake_flags(isa)
    ):
        return False
    return all(os.access(binary(cache, t, version, isa), os.X_OK) for t in TARGETS)


def pip_download_cmd(version: str, dest: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        f"llama-cpp-python=={version}",
        "-d",
        str(dest),
    ]


def cmake_configure_cmd(src: Path, build: Path, gen: str, isa: str = "native") -> list[str]:
    return [
        "cmake",
        "-S",
        str(src / "vendor" / "llama.cpp"),
        "-B",
        str(build),
        "-G",
        gen,
        *cmake_flags(isa),
    ]


def cmake_build_cmd(build: Path, jobs: int) -> list[str]:
    return ["cmake", "--build", str(build), "--target", *TARGETS, "-j", str(max(1, jobs))]


def quantize_cmd(quantize: Path, src: Path, dest: Path, gguf_type: str) -> list[str]:
    if gguf_type not in GGUF_TYPES:
        raise ValueError(f"unknown GGUF type {gguf_type!r} (one of {', '.join(GGUF_TYPES)})")
    return [str(quantize), "--allow-requantize", str(src), str(dest), gguf_type]


def _run(cmd: list[str], log_file: Path | None = None) -> None:
    log(" ".join(cmd))
    if log_file is None:
        subprocess.run(cmd, check=True)
        return
    with open(log_file, "a") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log_file.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{cmd[0]} failed ({proc.returncode}); end of {log_file}:\n{tail}")


def fetch_source(cache: Path, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The unpacked sdist (pip download, then untar), reused when already there."""
    src = version_dir(cache, version) / "src"
    if (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        return src
    dl = cache / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    sdist = dl / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        _run(pip_download_cmd(version, dl))
    if not sdist.is_file():
        raise SystemExit(f"pip did not leave {sdist}")
    # Unpack beside the destination and rename, so a killed unpack leaves no half tree.
    tmp = Path(tempfile.mkdtemp(prefix="src.", dir=version_dir(cache, version).parent))
    try:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        [top] = [p for p in tmp.iterdir() if p.is_dir()]
        src.parent.mkdir(parents=True, exist_ok=True)
        os.replace(top, src)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return src


def build(
    cache: Path,
    version: str = LLAMA_CPP_PYTHON_VERSION,
    jobs: int = 1,
    force: bool = False,
    isa: str = "native",
) -> Path:
    """Build llama-server and llama-quantize for `isa` unless already built; returns
    llama-server."""
    server = binary(cache, "llama-server", version, isa)
    if is_built(cache, version, isa) and not force:
        log(f"already built: {server}")
        return server
    src = fetch_source(cache, version)
    out = build_dir(cache, version, isa)
    out.mkdir(parents=True, exist_ok=True)
    (out / STAMP).unlink(missing_ok=True)
    gen = generator()
    build_log = out.with_name(out.name + ".log")  # build.log, build-avx2.log
    log(
        f"building llama.cpp ({isa}) from llama-cpp-python {version} (-j {jobs}); "
        f"log in {build_log}"
    )
    _run(cmake_configure_cmd(src, out, gen, isa), build_log)
    _run(cmake_build_cmd(out, jobs), build_log)
    (out / STAMP).write_text(stamp_text(version, gen, isa))
    log(f"built {server}")
    return server


def model_path(cache: Path, source: Path, gguf_type: str) -> Path:
    """Where the `gguf_type` copy of `source` lives (the source itself when it has that type)."""
    stem = source.stem.rsplit(".", 1)[0] if "." in source.stem else source.stem
    if source.stem.endswith("." + gguf_type):
        return source
    return cache / "models" / f"{stem}.{gguf_type}.gguf"


def make_gguf(quantize: Path, cache: Path, source: Path, gguf_type: str) -> Path:
    """The `gguf_type` GGUF of `source`, made once by llama-quantize and kept in the cache."""
    dest = model_path(cache, source, gguf_type)
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    _run(quantize_cmd(quantize, source, tmp, gguf_type), dest.parent / "quantize.log")
    os.replace(tmp, dest)
    return dest
