"""Build llama.cpp's `llama-server` from source, and make the GGUF files it serves.

The source is the llama.cpp tree vendored in the `llama-cpp-python` sdist (PyPI is
the one place this machine reaches), fetched with pip, unpacked and built with CMake
into a cache folder outside the repository:

    <cache>/<version>/src/                the unpacked sdist (vendor/llama.cpp inside)
    <cache>/<version>/build/bin/          llama-server, llama-quantize and their .so files
    <cache>/<version>/build/BUILT         written last: the version and the CMake flags
    <cache>/models/                       GGUF files made by llama-quantize

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
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    # ggml's AMX path (chosen by -march=native where the CPU lists AMX) dies in ldtilecfg
    # inside this workplace's VMs (SIGSEGV / SIGILL at the first matmul): leave it out.
    # llama.cpp then runs its AVX512 (VNNI, BF16) kernels.
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
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


def binary(cache: Path, name: str, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return version_dir(cache, version) / "build" / "bin" / name


def stamp_text(version: str, generator: str) -> str:
    return (
        "\n".join([f"llama-cpp-python=={version}", f"generator={generator}", *CMAKE_FLAGS]) + "\n"
    )


def generator() -> str:
    return "Ninja" if shutil.which("ninja") else "Unix Makefiles"


def is_built(cache: Path, version: str = LLAMA_CPP_PYTHON_VERSION) -> bool:
    """True when the stamp names this version and these flags and the binaries are there."""
    stamp = version_dir(cache, version) / "build" / STAMP
    if not stamp.is_file():
        return False
    lines = stamp.read_text().splitlines()
    if not lines or lines[0] != f"llama-cpp-python=={version}" or tuple(lines[2:]) != CMAKE_FLAGS:
        return False
    return all(os.access(binary(cache, t, version), os.X_OK) for t in TARGETS)


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


def cmake_configure_cmd(src: Path, build: Path, gen: str) -> list[str]:
    return [
        "cmake",
        "-S",
        str(src / "vendor" / "llama.cpp"),
        "-B",
        str(build),
        "-G",
        gen,
        *CMAKE_FLAGS,
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
    cache: Path, version: str = LLAMA_CPP_PYTHON_VERSION, jobs: int = 1, force: bool = False
) -> Path:
    """Build llama-server and llama-quantize unless already built; returns llama-server."""
    if is_built(cache, version) and not force:
        log(f"already built: {binary(cache, 'llama-server', version)}")
        return binary(cache, "llama-server", version)
    src = fetch_source(cache, version)
    out = version_dir(cache, version) / "build"
    out.mkdir(parents=True, exist_ok=True)
    (out / STAMP).unlink(missing_ok=True)
    gen = generator()
    build_log = version_dir(cache, version) / "build.log"
    log(f"building llama.cpp from llama-cpp-python {version} (-j {jobs}); log in {build_log}")
    _run(cmake_configure_cmd(src, out, gen), build_log)
    _run(cmake_build_cmd(out, jobs), build_log)
    (out / STAMP).write_text(stamp_text(version, gen))
    log(f"built {binary(cache, 'llama-server', version)}")
    return binary(cache, "llama-server", version)


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
