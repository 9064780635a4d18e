"""`python -m bench llamacpp`: the pieces that need neither the llama.cpp build nor a
server: argument parsing, the command lines, the skip-if-built logic, the GGUF step,
and the ratio table from two made-up runs. No network, no timing."""

from __future__ import annotations

import dataclasses
import io
import json
import stat
import tarfile
from pathlib import Path

import pytest

from bench import llamacpp as lc
from bench import llamacpp_build as lb
from bench import servers as srv
from bench.metrics import RequestRecord, by_turn, summarize
from kernels import cpu_features as cf

# An AVX512-BF16 host's flags (with AVX2's): both x86 paths run on it.
AVX512_HOST = cf.AVX512_BF16_FLAGS | cf.AVX2_FLAGS
# The flags the AVX2 build on the bench machine was made with by hand: the list must
# stay this one (order too) or its BUILT stamp stops matching and it is rebuilt.
AVX2_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DGGML_AVX512=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)


# --- arguments -----------------------------------------------------------------
def test_compare_defaults_match_the_documented_run():
    args = lc.parse_args(["compare"])
    assert args.pairs == ["bf16", "int8", "int4"]
    assert (args.threads, args.ctx, args.parallel) == (2, 65536, 16)
    assert not args.quick and args.llama_server is None
    assert args.out == Path("bench-results/llamacpp.json")
    assert args.isa == "native"


def test_compare_options():
    args = lc.parse_args(
        ["compare", "--quick", "--pairs", "INT4, int8,int4", "--llama-server", "/x/llama-server"]
    )
    assert args.quick and args.pairs == ["int4", "int8"]
    assert args.llama_server == "/x/llama-server"


@pytest.mark.parametrize(
    "argv",
    [
        [], ["compare", "--pairs", "fp8"], ["compare", "--pairs", ","], ["compare", "--threads", "0"],
        ["compare", "--isa", "avx512"], ["build", "--isa", "sse4"],
    ],
)  # fmt: skip
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        lc.parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_build_defaults_to_one_job():
    args = lc.parse_args(["build", "--cache", "/tmp/c"])
    assert (args.jobs, args.force, args.cache) == (1, False, "/tmp/c")
    assert args.version == lb.LLAMA_CPP_PYTHON_VERSION
    assert args.isa == "native"


def test_isa_is_chosen_for_build_and_compare(tmp_path, monkeypatch):
    assert lc.parse_args(["compare", "--isa", "avx2"]).isa == "avx2"
    built = []
    monkeypatch.setattr(lb, "build", lambda *a: built.append(a) or Path("/x"))
    lc.main(["build", "--cache", str(tmp_path), "--isa", "avx2", "-j", "2"])
    assert built == [(tmp_path, lb.LLAMA_CPP_PYTHON_VERSION, 2, False, "avx2")]


def test_missing_llama_server_says_how_to_get_one(tmp_path):
    args = lc.parse_args(["compare", "--cache", str(tmp_path)])
    with pytest.raises(SystemExit, match="python -m bench llamacpp build`"):
        lc.resolve_binaries(args)
    args = lc.parse_args(["compare", "--cache", str(tmp_path), "--isa", "avx2"])
    with pytest.raises(SystemExit, match="python -m bench llamacpp build --isa avx2`"):
        lc.resolve_binaries(args)


def test_compare_takes_the_binaries_of_its_isa(tmp_path):
    _fake_built(tmp_path, isa="avx2")
    args = lc.parse_args(["compare", "--cache", str(tmp_path), "--isa", "avx2"])
    bin_dir = lb.version_dir(tmp_path) / "build-avx2" / "bin"
    assert lc.resolve_binaries(args) == (bin_dir / "llama-server", bin_dir / "llama-quantize")
    with pytest.raises(SystemExit):  # the native build is not there
        lc.resolve_binaries(lc.parse_args(["compare", "--cache", str(tmp_path)]))


def test_cache_dir_override_order(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXCHAT_LLAMACPP_CACHE", str(tmp_path / "env"))
    assert lb.cache_dir(tmp_path / "arg") == tmp_path / "arg"
    assert lb.cache_dir() == tmp_path / "env"
    monkeypatch.delenv("PREFIXCHAT_LLAMACPP_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert lb.cache_dir() == tmp_path / "xdg" / "prefixchat" / "llama.cpp"


# --- command lines -------------------------------------------------------------
def test_cmake_command_lines(tmp_path):
    configure = lb.cmake_configure_cmd(tmp_path / "src", tmp_path / "build", "Ninja")
    assert configure[:7] == [
        "cmake", "-S", str(tmp_path / "src" / "vendor" / "llama.cpp"),
        "-B", str(tmp_path / "build"), "-G", "Ninja",
    ]  # fmt: skip
    for flag in (
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
    ):
        assert flag in configure
    assert lb.cmake_build_cmd(tmp_path / "build", 0) == [
        "cmake", "--build", str(tmp_path / "build"),
        "--target", "llama-server", "llama-quantize", "-j", "1",
    ]  # fmt: skip
    # The native flags are what existing BUILT stamps hold: AMX left out, nothing else.
    assert lb.cmake_flags() == lb.cmake_flags("native") == lb.CMAKE_FLAGS
    assert "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in configure
    native = lb.cmake_configure_cmd(tmp_path / "src", tmp_path / "build", "Ninja", "native")
    assert native == configure


def test_avx2_build_has_its_own_flags_and_folder(tmp_path):
    configure = lb.cmake_configure_cmd(tmp_path / "src", tmp_path / "b", "Ninja", isa="avx2")
    assert tuple(configure[7:]) == lb.cmake_flags("avx2") == AVX2_FLAGS
    assert "-DGGML_NATIVE=ON" not in configure
    assert not [f for f in configure if "amx" in f.lower() or "FLAGS=" in f]
    version = lb.version_dir(tmp_path)
    assert lb.build_dir(tmp_path) == version / "build"
    assert lb.build_dir(tmp_path, isa="avx2") == version / "build-avx2"
    assert lb.binary(tmp_path, "llama-server", isa="avx2") == (
        version / "build-avx2" / "bin" / "llama-server"
    )
    assert lb.binary(tmp_path, "llama-server") == version / "build" / "bin" / "llama-server"
    assert lb.stamp_text("1.0", "Ninja", "avx2").splitlines()[2:] == list(AVX2_FLAGS)
    with pytest.raises(ValueError, match="unknown ISA"):
        lb.cmake_flags("avx512")


def test_generator_falls_back_to_makefiles(monkeypatch):
    monkeypatch.setattr(lb.shutil, "which", lambda name: None)
    assert lb.generator() == "Unix Makefiles"
    monkeypatch.setattr(lb.shutil, "which", lambda name: "/usr/bin/ninja")
    assert lb.generator() == "Ninja"


def test_pip_fetches_the_sdist_only():
    cmd = lb.pip_download_cmd("0.3.36", Path("/d"))
    assert cmd[1:] == [
        "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        "llama-cpp-python==0.3.36", "-d", "/d",
    ]  # fmt: skip


def test_llama_server_command_line():
    cmd = srv.llama_server_cmd(Path("/b/llama-server"), Path("/m/x.gguf"), 8123, srv.ServerSettings())
    joined = " ".join(cmd)
    for part in ("-m /m/x.gguf", "--port 8123", "-t 2", "-c 65536", "--parallel 16"):
        assert part in joined
    assert "--host 127.0.0.1" in joined
    assert "--kv-unified" in cmd and "--cache-prompt" in cmd


def test_our_server_environment_asks_for_the_dtype(tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    env = srv.ours_env("int8", tmp_path / "db.sqlite3", srv.ServerSettings(threads=3))
    assert env["LLM_WEIGHT_DTYPE"] == "int8"
    assert env["OMP_NUM_THREADS"] == "3" and env["LLM_MAX_NUM_SEQS"] == "16"
    assert env["DATABASE_URL"] == f"sqlite:///{tmp_path / 'db.sqlite3'}"
    assert "REDIS_URL" not in env


# --- build: skip when built ----------------------------------------------------
def _fake_built(cache: Path, version: str = lb.LLAMA_CPP_PYTHON_VERSION, isa: str = "native") -> None:
    for name in lb.TARGETS:
        path = lb.binary(cache, name, version, isa)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (path.parent.parent / lb.STAMP).write_text(lb.stamp_text(version, "Ninja", isa))


def test_is_built_needs_stamp_binaries_and_same_version(tmp_path):
    assert not lb.is_built(tmp_path)
    _fake_built(tmp_path)
    assert lb.is_built(tmp_path)
    assert not lb.is_built(tmp_path, "0.0.1")
    stamp = lb.version_dir(tmp_path) / "build" / lb.STAMP
    stamp.write_text(stamp.read_text().replace("-DGGML_NATIVE=ON", "-DGGML_NATIVE=OFF"))
    assert not lb.is_built(tmp_path)  # other flags: rebuild
    _fake_built(tmp_path)
    lb.binary(tmp_path, "llama-server").chmod(0o644)
    assert not lb.is_built(tmp_path)


def test_each_isa_is_built_on_its_own(tmp_path):
    _fake_built(tmp_path)
    assert lb.is_built(tmp_path) and not lb.is_built(tmp_path, isa="avx2")
    _fake_built(tmp_path, isa="avx2")
    assert lb.is_built(tmp_path, isa="avx2")
    # A native stamp in the avx2 folder (or the other way round) is a stale build.
    native_stamp = (lb.build_dir(tmp_path) / lb.STAMP).read_text()
    (lb.build_dir(tmp_path, isa="avx2") / lb.STAMP).write_text(native_stamp)
    assert not lb.is_built(tmp_path, isa="avx2") and lb.is_built(tmp_path)


def test_the_hand_made_avx2_stamp_is_accepted(tmp_path):
    """The stamp written for a build configured with exactly AVX2_FLAGS by Makefiles."""
    _fake_built(tmp_path, isa="avx2")
    text = "\n".join(
        [f"llama-cpp-python=={lb.LLAMA_CPP_PYTHON_VERSION}", "generator=Unix Makefiles",
         *AVX2_FLAGS]
    ) + "\n"  # fmt: skip
    (lb.build_dir(tmp_path, isa="avx2") / lb.STAMP).write_text(text)
    assert lb.is_built(tmp_path, isa="avx2")


def test_build_is_skipped_when_built(tmp_path, monkeypatch):
    _fake_built(tmp_path)

    def no_commands(*a, **k):
        raise AssertionError("nothing may run")

    monkeypatch.setattr(lb, "_run", no_commands)
    assert lb.build(tmp_path) == lb.binary(tmp_path, "llama-server")
    _fake_built(tmp_path, isa="avx2")
    assert lb.build(tmp_path, isa="avx2") == lb.binary(tmp_path, "llama-server", isa="avx2")


def _fake_sdist(dl: Path, version: str) -> None:
    dl.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dl / f"llama_cpp_python-{version}.tar.gz", "w:gz") as tar:
        data = b"project(llama.cpp)\n"
        info = tarfile.TarInfo(f"llama_cpp_python-{version}/vendor/llama.cpp/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def test_build_unpacks_configures_builds_and_stamps(tmp_path, monkeypatch):
    version = "9.9.9"
    _fake_sdist(tmp_path / "dl", version)
    ran: list[list[str]] = []

    def fake_run(cmd, log_file=None):
        ran.append(cmd)
        if cmd[:2] == ["cmake", "--build"]:  # the build leaves the binaries
            for name in lb.TARGETS:
                path = lb.binary(tmp_path, name, version)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("")
                path.chmod(0o755)

    monkeypatch.setattr(lb, "_run", fake_run)
    monkeypatch.setattr(lb.shutil, "which", lambda name: None)
    server = lb.build(tmp_path, version, jobs=3)
    src = lb.version_dir(tmp_path, version) / "src"
    assert (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file()
    assert ran == [
        lb.cmake_configure_cmd(src, src.parent / "build", "Unix Makefiles"),
        lb.cmake_build_cmd(src.parent / "build", 3),
    ]  # the sdist was there: no pip
    assert server == lb.binary(tmp_path, "llama-server", version)
    assert lb.is_built(tmp_path, version)
    ran.clear()
    lb.build(tmp_path, version)
    assert ran == []


def test_avx2_build_configures_its_folder_and_stamps_it(tmp_path, monkeypatch):
    version = "9.9.9"
    _fake_sdist(tmp_path / "dl", version)
    ran: list[tuple[list[str], Path | None]] = []

    def fake_run(cmd, log_file=None):
        ran.append((cmd, log_file))
        if cmd[:2] == ["cmake", "--build"]:
            for name in lb.TARGETS:
                path = lb.binary(tmp_path, name, version, "avx2")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("")
                path.chmod(0o755)

    monkeypatch.setattr(lb, "_run", fake_run)
    monkeypatch.setattr(lb.shutil, "which", lambda name: "/usr/bin/ninja")
    server = lb.build(tmp_path, version, jobs=2, isa="avx2")
    src, out = lb.version_dir(tmp_path, version) / "src", lb.build_dir(tmp_path, version, "avx2")
    assert out.name == "build-avx2"
    assert [cmd for cmd, _ in ran] == [
        lb.cmake_configure_cmd(src, out, "Ninja", "avx2"),
        lb.cmake_build_cmd(out, 2),
    ]
    assert "-DGGML_AVX512=OFF" in ran[0][0] and "-DGGML_NATIVE=OFF" in ran[0][0]
    assert {log for _, log in ran} == {out.parent / "build-avx2.log"}
    assert server == out / "bin" / "llama-server"
    assert lb.is_built(tmp_path, version, "avx2") and not lb.is_built(tmp_path, version)
    assert (out / lb.STAMP).read_text() == lb.stamp_text(version, "Ninja", "avx2")


# --- GGUF files ----------------------------------------------------------------
def test_quantize_command_requantises_the_shipped_file(tmp_path):
    source = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    dest = lb.model_path(tmp_path, source, "Q8_0")
    assert dest == tmp_path / "models" / "SmolLM2-135M-Instruct.Q8_0.gguf"
    assert lb.model_path(tmp_path, source, "Q4_1") == source
    assert lb.quantize_cmd(Path("/b/llama-quantize"), source, dest, "Q8_0") == [
        "/b/llama-quantize", "--allow-requantize", str(source), str(dest), "Q8_0",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown GGUF type"):
        lb.quantize_cmd(Path("q"), source, dest, "Q3_X")


def test_make_gguf_runs_once(tmp_path, monkeypatch):
    source = tmp_path / "m.Q4_1.gguf"
    ran = []

    def fake_run(cmd, log_file=None):
        ran.append(cmd)
        Path(cmd[3]).write_bytes(b"GGUF")

    monkeypatch.setattr(lb, "_run", fake_run)
    made = lb.make_gguf(Path("/b/llama-quantize"), tmp_path, source, "BF16")
    assert made == tmp_path / "models" / "m.BF16.gguf" and made.read_bytes() == b"GGUF"
    assert ran[0][-1] == "BF16" and ran[0][3].endswith(".part")
    assert lb.make_gguf(Path("/b/llama-quantize"), tmp_path, source, "BF16") == made
    assert len(ran) == 1
    assert not list((tmp_path / "models").glob("*.part"))


# --- workloads -----------------------------------------------------------------
def test_warm_set_shares_the_system_prompt_not_the_users():
    fresh, warm = lc.shared_prefix_workloads(lc.QUICK, seed=0, tokenizer=None)
    assert len(fresh.conversations) == len(warm.conversations) == lc.QUICK.prefix_requests
    assert {c.system for c in warm.conversations} == {fresh.conversations[0].system}
    assert [c.turns[0].user for c in warm.conversations] != [
        c.turns[0].user for c in fresh.conversations
    ]


def test_decode_workload_is_one_request_a_round():
    work = lc.decode_workload(lc.Sizes())
    assert work.reply_tokens == 256 and work.num_requests == 1 and lc.Sizes().decode_rounds == 4
    assert work.conversations[0].messages([]) == [{"role": "user", "content": lc.DECODE_PROMPT}]


class _WordTokenizer:
    """Counts words as tokens (the fake of SmolLM2's tokenizer)."""

    def encode(self, text, add_special_tokens=False):
        return text.split()


@pytest.mark.parametrize("tokenizer", [None, _WordTokenizer()])
def test_cold_prompts_are_new_to_the_server(tokenizer):
    """Each cold round's prompt is system_tokens long and opens with what no other
    prompt of the run opens with: not another round's, not any other phase's."""
    sizes = dataclasses.replace(lc.Sizes(), cold_rounds=12)
    assert (lc.Sizes().cold_rounds, lc.QUICK.cold_rounds) == (5, 1)
    colds = [lc.cold_workload(sizes, 0, r, tokenizer) for r in range(sizes.cold_rounds)]
    for r, work in enumerate(colds):
        assert work.name == "cold" and work.num_requests == 1
        assert work.reply_tokens == sizes.cold_reply_tokens <= 4
        conv = work.conversations[0]
        assert conv.system.split()[0] == f"{r + 1}."
        assert conv.system_tokens == len(conv.system.split()) == sizes.system_tokens
        assert conv.messages([])[0] == {"role": "system", "content": conv.system}
        assert not work.system_seen_before(0, warmed=False)
    systems = [w.conversations[0].system for w in colds]
    assert len({s.split()[0] for s in systems}) == len(systems)
    # The first rounds (the default 3 and more) differ from each other at the first character.
    assert len({s[0] for s in systems[:9]}) == 9
    # Every other prompt the run sends opens with a word, never a digit.
    fresh, warm = lc.shared_prefix_workloads(sizes, 0, tokenizer)
    later, _ = lc.shared_prefix_workloads(sizes, lc.PREFIX_ROUND_SEED_STEP, tokenizer)
    multi = lc.multiturn_workload(sizes, 0, tokenizer)
    others = [lc.decode_workload(sizes), fresh, warm, later, multi]
    openings = [m["content"] for w in others for m in w.warmup_messages()]
    openings += [m["content"] for w in others for c in w.conversations for m in c.messages([])[:1]]
    assert openings and not [o for o in openings if o[:1].isdigit() or o in systems]
    # Another seed, another text after the same opening.
    assert lc.cold_workload(sizes, 1, 0, tokenizer).conversations[0].system != systems[0]


# --- figures and the table -----------------------------------------------------
def _phase(ttft: float, tpot: float, tokens: int, n: int, cached: int, duration: float) -> dict:
    """A phase's result as `phase` returns it, from records with chosen timestamps."""
    records = []
    for i in range(n):
        rec = RequestRecord(conversation=i, turn=1, start=0.0)
        rec.first_token = ttft
        rec.end = ttft + tpot * (tokens - 1)
        rec.chunk_times = [ttft]
        rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens = 100, tokens, cached
        records.append(rec)
    return {"summary": summarize(records, duration), "by_turn": by_turn(records)}


def _run(ttft_fresh: float, ttft_warm: float, tpot: float, mt_duration: float,
         later_rounds: tuple = (), ttft_cold: float = 0.3) -> dict:
    """A server's run; later_rounds: (fresh, warm) TTFTs of the prefix rounds after the first."""
    return {
        "fresh": _phase(ttft_fresh, 0.01, 8, 4, 0, 1.0),
        "warm": _phase(ttft_warm, 0.01, 8, 4, 50, 1.0),
        "decode": _phase(0.05, tpot, 256, 2, 0, 10.0),
        "cold": _phase(ttft_cold, 0.01, 4, 3, 0, 3.0),
        "multiturn": _phase(0.2, 0.05, 64, 10, 80, mt_duration),
        "prefix_rounds": [
            {"fresh": _phase(f, 0.01, 8, 4, 0, 1.0), "warm": _phase(w, 0.01, 8, 4, 50, 1.0)}
            for f, w in later_rounds
        ],
    }


def test_figures_of_a_run():
    fig = lc.figures(_run(0.4, 0.1, 0.02, 8.0))
    assert fig["decode_tok_s"] == pytest.approx(50.0)
    assert fig["decode_reply_tokens"] == 256
    assert fig["multiturn_output_tok_s"] == pytest.approx(640 / 8.0)
    assert fig["multiturn_ttft_p90_ms"] == pytest.approx(200.0)
    assert fig["multiturn_cached_share"] == pytest.approx(0.8)
    assert fig["fresh_ttft_p50_ms"] == pytest.approx(400.0)
    assert fig["fresh_over_warm"] == pytest.approx(4.0)
    assert fig["fresh_over_warm_median"] == pytest.approx(4.0)  # the one round
    assert fig["cold_ttft_p50_ms"] == pytest.approx(300.0)


def test_later_prefix_rounds_give_the_median_fresh_over_warm():
    run = _run(0.4, 0.1, 0.02, 8.0, later_rounds=((0.3, 0.2), (0.2, 0.1)))
    assert lc.fresh_over_warm_by_round(run) == [
        pytest.approx(4.0), pytest.approx(1.5), pytest.approx(2.0)
    ]
    fig = lc.figures(run)
    # The first round stays the just-started server's; the median takes all three.
    assert fig["fresh_over_warm"] == pytest.approx(4.0)
    assert fig["fresh_over_warm_median"] == pytest.approx(2.0)
    pair = {"ours_dtype": "bf16", "llamacpp_type": "BF16",
            "rows": lc.pair_rows(fig, lc.figures(_run(0.2, 0.1, 0.01, 4.0))),
            "fresh_over_warm_by_round": {"ours": lc.fresh_over_warm_by_round(run),
                                         "llamacpp": [2.0]}}
    assert "fresh/warm by round: ours 4.00 1.50 2.00; l.cpp 2.00" in lc.table([pair])


def test_each_later_prefix_round_has_its_own_system_prompt(monkeypatch):
    seen = []

    async def fake_phase(server, workload, *a):
        seen.append((workload.name, workload.conversations[0].system,
                     workload.conversations[0].turns[0].user))
        return {}

    monkeypatch.setattr(lc, "phase", fake_phase)
    server = srv.Server("ours-bf16", "http://127.0.0.1:1", _FakeProc(), None, 1.0)
    sizes = dataclasses.replace(lc.QUICK, prefix_rounds=3)
    result = lc.run_server(server, sizes, 0, None, 16)
    assert len(result["prefix_rounds"]) == 2
    prefix = [s for s in seen if s[0] == "prefix"]
    assert len(prefix) == 6  # fresh and warm, three rounds
    systems = [s[1] for s in prefix]
    # fresh and warm of a round share a system prompt; no two rounds do.
    assert all(systems[i] == systems[i + 1] for i in (0, 2, 4))
    assert len(set(systems)) == 3
    assert len({s[2] for s in prefix}) == 6  # and every wave's users are new
    # The multi-turn phase runs on the just-started round's heels, before later rounds.
    assert [s[0] for s in seen][2] != "prefix"


def test_ratio_table_from_two_runs():
    ours, theirs = lc.figures(_run(0.4, 0.1, 0.02, 8.0)), lc.figures(_run(0.2, 0.1, 0.01, 4.0))
    rows = {r["metric"]: r for r in lc.pair_rows(ours, theirs)}
    assert [r["metric"] for r in lc.pair_rows(ours, theirs)] == [m[0] for m in lc.METRICS]
    assert rows["decode_tok_s"]["ratio"] == pytest.approx(0.5)
    assert rows["multiturn_output_tok_s"]["ratio"] == pytest.approx(0.5)
    assert rows["multiturn_ttft_p90_ms"]["ratio"] == pytest.approx(1.0)
    assert rows["fresh_ttft_p50_ms"]["ratio"] == pytest.approx(2.0)
    assert rows["fresh_over_warm"]["ours"] == pytest.approx(4.0)
    assert rows["fresh_over_warm"]["llamacpp"] == pytest.approx(2.0)
    pair = {"ours_dtype": "int8", "llamacpp_type": "Q8_0", "rows": list(rows.values())}
    text = lc.table([pair, {**pair, "decode_ratio_by_round": [1.234, None]}])
    assert "ours int8 vs llama.cpp Q8_0" in text
    decode_line = next(line for line in text.splitlines() if line.startswith("decode tok/s"))
    assert decode_line.split()[-4:] == ["50.0", "100.0", "0.50", "^"]
    assert "decode ours/l.cpp by round: 1.23 -" in text


def test_cold_prompt_row_and_ratios():
    ours = lc.figures(_run(0.4, 0.1, 0.02, 8.0, ttft_cold=0.45))
    theirs = lc.figures(_run(0.2, 0.1, 0.01, 4.0, ttft_cold=0.5))
    rows = {r["metric"]: r for r in lc.pair_rows(ours, theirs)}
    cold = rows["cold_ttft_p50_ms"]
    assert cold["label"] == "cold 512-token prompt TTFT p50 (ms)" and cold["better"] == "lower"
    assert (cold["ours"], cold["llamacpp"]) == (pytest.approx(450.0), pytest.approx(500.0))
    assert cold["ratio"] == pytest.approx(0.9)
    quick = {r["metric"]: r for r in lc.pair_rows(ours, theirs, lc.QUICK.system_tokens)}
    assert quick["cold_ttft_p50_ms"]["label"] == "cold 256-token prompt TTFT p50 (ms)"
    # The existing rows stay as they were, in their order, the cold one after them.
    assert list(rows)[-1] == "cold_ttft_p50_ms"
    assert list(rows)[:-1] == [
        "decode_tok_s", "decode_reply_tokens", "multiturn_output_tok_s", "multiturn_ttft_p50_ms",
        "multiturn_ttft_p90_ms", "multiturn_cached_share", "fresh_ttft_p50_ms",
        "warm_ttft_p50_ms", "fresh_over_warm", "fresh_over_warm_median",
    ]  # fmt: skip
    pair = {"ours_dtype": "int8", "llamacpp_type": "Q8_0", "rows": list(rows.values()),
            "cold_ratio_by_round": [0.912, None]}  # fmt: skip
    lines = lc.table([pair]).splitlines()
    cold_line = next(line for line in lines if line.startswith("cold 512-token prompt TTFT p50"))
    assert cold_line.split()[-4:] == ["450", "500", "0.90", "v"]
    assert "cold TTFT ours/l.cpp by round: 0.91 -" in lines


def test_cold_ratio_by_round_pairs_the_rounds():
    ours = {"cold": {"ttft_s_by_round": [0.4, 0.5, None]}}
    theirs = {"cold": {"ttft_s_by_round": [0.5, 0.5, 0.6]}}
    assert lc.cold_ratio_by_round(ours, theirs) == [pytest.approx(0.8), pytest.approx(1.0), None]
    assert lc.cold_ratio_by_round({"error": "exited"}, theirs) == []


def test_missing_figures_print_as_dashes():
    empty = {"summary": summarize([], 0.0), "by_turn": []}
    fig = lc.figures(
        {"fresh": empty, "warm": empty, "decode": empty, "multiturn": empty, "cold": empty}
    )
    assert fig["decode_tok_s"] is None and fig["fresh_over_warm"] is None
    assert fig["cold_ttft_p50_ms"] is None
    rows = lc.pair_rows(fig, fig)
    assert all(r["ratio"] is None for r in rows)
    pair = {"ours_dtype": "bf16", "llamacpp_type": "BF16", "rows": rows}
    assert " - " in lc.table([pair])


class _FakeProc:
    returncode = None

    def terminate(self):
        self.returncode = -15

    def wait(self, timeout=None):
        return self.returncode


def _contender(label: str, start) -> lc.Contender:
    return lc.Contender(label, start, 1, {"server": label.split("-")[0]})


def test_a_server_that_fails_is_recorded_and_the_pair_goes_on(monkeypatch, tmp_path):
    def refuse(label):
        raise RuntimeError("server exited with -11")

    proc = _FakeProc()
    fake = srv.Server("ours-int8", "http://127.0.0.1:1", proc, tmp_path / "log", 1.0, "key")
    monkeypatch.setattr(lc, "run_server", lambda server, *a: {"startup_s": server.startup_s})
    decoded = []
    monkeypatch.setattr(lc, "alternating_decode",
                        lambda live, *a: decoded.append(("decode", list(live))) or {k: {} for k in live})
    monkeypatch.setattr(lc, "alternating_cold",
                        lambda live, *a: decoded.append(("cold", list(live))) or {k: {} for k in live})
    runs = lc.measured_pair(
        [_contender("llamacpp-Q8_0", refuse), _contender("ours-int8", lambda label: fake)],
        lc.QUICK, 0, None,
    )  # fmt: skip
    assert runs["llamacpp-Q8_0"] == {"server": "llamacpp", "error": "server exited with -11"}
    assert set(lc.figures(runs["llamacpp-Q8_0"]).values()) == {None}
    assert runs["ours-int8"] == {"server": "ours", "startup_s": 1.0, "decode": {}, "cold": {}}
    assert decoded == [("decode", ["ours-int8"]), ("cold", ["ours-int8"])]
    assert proc.returncode == -15
    assert lc.decode_ratio_by_round(runs["ours-int8"], runs["llamacpp-Q8_0"]) == []
    assert lc.cold_ratio_by_round(runs["ours-int8"], runs["llamacpp-Q8_0"]) == []


class _FakeClient:
    """http_client.Client without the network: the fake measure below answers for it."""

    def __init__(self, options):
        self.options, self.closed = options, False

        async def close():
            self.closed = True

        self.api = type("Api", (), {"close": staticmethod(close)})()

    async def resolve_model(self):
        return "m"


def _fake_measure(seen: list, ttft: dict, tpot: float = 0.02):
    """http_client.measure that records (server, workload, its system prompt, ignore_eos) and
    answers with one request of the server's TTFT."""

    async def measure(client, workload, concurrency, tokenizer, block_size, warmup):
        assert concurrency == 1 and warmup is False and workload.num_requests == 1
        server = client.options.url
        seen.append((server, workload.name, workload.conversations[0].system,
                     client.options.ignore_eos))  # fmt: skip
        rec = RequestRecord(conversation=0, turn=1, start=0.0)
        rec.first_token, rec.completion_tokens = ttft[server], workload.reply_tokens
        rec.end = ttft[server] + tpot * (workload.reply_tokens - 1)
        rec.chunk_times = [rec.first_token]
        return None, [rec], rec.end

    return measure


def _live_pair() -> dict:
    return {
        label: (srv.Server(label, url, _FakeProc(), None, 1.0), block)
        for label, url, block in (("llamacpp-BF16", "http://l", 1), ("ours-bf16", "http://o", 16))
    }


def test_cold_rounds_alternate_on_a_new_prompt_each(monkeypatch):
    seen = []
    monkeypatch.setattr(lc.client, "Client", _FakeClient)
    monkeypatch.setattr(lc.client, "measure", _fake_measure(seen, {"http://l": 0.5, "http://o": 0.4}))
    sizes = dataclasses.replace(lc.QUICK, cold_rounds=3)
    cold = lc.alternating_cold(_live_pair(), sizes, 0, None)
    # llama-server first, then ours, round by round; both get the round's prompt.
    assert [(s[0], s[1]) for s in seen] == [("http://l", "cold"), ("http://o", "cold")] * 3
    systems = [s[2] for s in seen]
    assert systems[0::2] == systems[1::2] and len(set(systems)) == 3
    assert all(s[3] for s in seen)  # ignore_eos: the first token is never an end
    for label, ttft in (("llamacpp-BF16", 0.5), ("ours-bf16", 0.4)):
        assert cold[label]["rounds"] == 3 and cold[label]["concurrency"] == 1
        assert cold[label]["ttft_s_by_round"] == [pytest.approx(ttft)] * 3
        assert cold[label]["workload"]["name"] == "cold"
        assert cold[label]["summary"]["ttft_s"]["p50"] == pytest.approx(ttft)
    runs = {"ours": {"cold": cold["ours-bf16"]}, "theirs": {"cold": cold["llamacpp-BF16"]}}
    assert lc.cold_ratio_by_round(runs["ours"], runs["theirs"]) == [pytest.approx(0.8)] * 3


def test_decode_rounds_still_alternate_on_one_prompt(monkeypatch):
    seen = []
    monkeypatch.setattr(lc.client, "Client", _FakeClient)
    monkeypatch.setattr(lc.client, "measure", _fake_measure(seen, {"http://l": 0.1, "http://o": 0.1}))
    sizes = dataclasses.replace(lc.QUICK, decode_rounds=2)
    decode = lc.alternating_decode(_live_pair(), sizes, None)
    assert [(s[0], s[1]) for s in seen] == [("http://l", "decode"), ("http://o", "decode")] * 2
    assert all(s[3] for s in seen)
    for run in decode.values():
        assert run["rounds"] == 2 and run["tpot_s_by_round"] == [pytest.approx(0.02)] * 2
        assert "ttft_s_by_round" not in run


def test_cold_rounds_come_after_the_decode_rounds(monkeypatch):
    calls = []
    monkeypatch.setattr(lc, "run_server", lambda server, *a: calls.append("workloads") or {})
    monkeypatch.setattr(lc, "alternating_decode",
                        lambda live, *a: calls.append("decode") or {k: {"d": 1} for k in live})
    monkeypatch.setattr(lc, "alternating_cold",
                        lambda live, *a: calls.append("cold") or {k: {"c": 1} for k in live})
    fakes = [srv.Server(label, "http://127.0.0.1:1", _FakeProc(), None, 1.0)
             for label in ("llamacpp-BF16", "ours-bf16")]  # fmt: skip
    runs = lc.measured_pair([_contender(f.label, lambda label, f=f: f) for f in fakes],
                            lc.QUICK, 0, None)  # fmt: skip
    assert calls == ["workloads", "workloads", "decode", "cold"]
    assert all(run["cold"] == {"c": 1} and run["decode"] == {"d": 1} for run in runs.values())


def test_both_servers_are_stopped_when_a_workload_fails(monkeypatch, tmp_path):
    procs = [_FakeProc(), _FakeProc()]
    fakes = [srv.Server(n, "http://127.0.0.1:1", p, tmp_path / "log", 1.0)
             for n, p in zip(("llamacpp-BF16", "ours-bf16"), procs, strict=True)]

    def boom(server, *a):
        raise ConnectionError("reset")

    monkeypatch.setattr(lc, "run_server", boom)
    with pytest.raises(ConnectionError):
        lc.measured_pair([_contender(f.label, lambda label, f=f: f) for f in fakes],
                         lc.QUICK, 0, None)
    assert [p.returncode for p in procs] == [-15, -15]


def test_decode_ratio_by_round_pairs_the_rounds():
    ours = {"decode": {"tpot_s_by_round": [0.02, 0.025, None]}}
    theirs = {"decode": {"tpot_s_by_round": [0.03, 0.025, 0.03]}}
    assert lc.decode_ratio_by_round(ours, theirs) == [pytest.approx(1.5), pytest.approx(1.0), None]


# --- kernel paths --------------------------------------------------------------
@pytest.fixture
def avx512_host(monkeypatch):
    """This CPU, as kernels.cpu_features sees it, is an AVX512-BF16 x86 host."""
    monkeypatch.setattr(cf, "cpu_flags", lambda: AVX512_HOST)
    monkeypatch.delenv(cf.ENV, raising=False)


def test_local_cpu_path_follows_the_given_environment(avx512_host, monkeypatch):
    assert srv.local_cpu_path({}) == "avx512-bf16"
    assert srv.local_cpu_path({cf.ENV: "avx2"}) == "avx2"
    assert srv.local_cpu_path({cf.ENV: "auto"}) == "avx512-bf16"
    assert cf.ENV not in lc.os.environ  # put back as it was
    monkeypatch.setenv(cf.ENV, "generic")
    assert srv.local_cpu_path({}) == "avx512-bf16"  # `env`'s value, not this process's
    assert lc.os.environ[cf.ENV] == "generic"


class _Response:
    def __init__(self, body: bytes):
        self.body, self.status = body, 200

    def read(self) -> bytes:
        return self.body

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (b'{"status": "ready", "checks": {}, "cpu_path": "avx2"}', "avx2"),
        # Where the dashboard reports the loaded engine's identity.
        (b'{"status": "ready", "checks": {"model": {"ok": true, "cpu_path": "neon"}}}', "neon"),
        (b'{"status": "ready", "checks": {"model": {"ok": true, "cpu_path": null}}}', None),
        (b'[1]', None),
        (b'{"status": "ready", "checks": {}}', None),  # a server without the key
        (b"not json", None),
        (OSError("refused"), None),
    ],
)
def test_readyz_cpu_path(monkeypatch, answer, expected):
    asked = []

    def fake_urlopen(url, timeout=None):
        asked.append(url)
        if isinstance(answer, Exception):
            raise answer
        return _Response(answer)

    monkeypatch.setattr(srv.urllib.request, "urlopen", fake_urlopen)
    assert srv.readyz_cpu_path("http://127.0.0.1:9") == expected
    assert asked == ["http://127.0.0.1:9/readyz"]


def test_ours_cpu_path_prefers_readyz(avx512_host, monkeypatch):
    monkeypatch.setattr(srv, "readyz_cpu_path", lambda url: "generic")
    assert srv.ours_cpu_path("http://x", {cf.ENV: "avx2"}) == ("generic", "readyz")
    monkeypatch.setattr(srv, "readyz_cpu_path", lambda url: None)
    assert srv.ours_cpu_path("http://x", {cf.ENV: "avx2"}) == ("avx2", "local")


def test_start_ours_passes_the_environment_and_records_its_path(avx512_host, monkeypatch, tmp_path):
    monkeypatch.setenv(cf.ENV, "avx2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    envs = []
    monkeypatch.setattr(srv, "_manage", lambda env, *a: envs.append(env) or "key\n")
    monkeypatch.setattr(
        srv.subprocess, "Popen", lambda cmd, env=None, **k: envs.append(env) or _FakeProc()
    )
    monkeypatch.setattr(srv, "wait_ready", lambda *a: None)
    monkeypatch.setattr(srv, "readyz_cpu_path", lambda url: None)
    server = srv.start_ours("int8", "ours-int8", srv.ServerSettings(), tmp_path, tmp_path / "db")
    assert all(e[cf.ENV] == "avx2" and e["ATEN_CPU_CAPABILITY"] == "avx2" for e in envs)
    assert (server.cpu_path, server.cpu_path_from) == ("avx2", "local")


def test_run_server_records_our_path(monkeypatch):
    async def fake_phase(*a):
        return {}

    monkeypatch.setattr(lc, "phase", fake_phase)
    ours = srv.Server("ours-bf16", "http://x", _FakeProc(), None, 1.0, "k", "avx2", "readyz")
    result = lc.run_server(ours, lc.QUICK, 0, None, 16)
    assert (result["cpu_path"], result["cpu_path_from"]) == ("avx2", "readyz")
    theirs = srv.Server("llamacpp-BF16", "http://x", _FakeProc(), None, 1.0)
    assert "cpu_path" not in lc.run_server(theirs, lc.QUICK, 0, None, 1)


def test_kernel_path_info_says_when_ours_was_forced():
    kp = lc.kernel_path_info("avx2", "avx2", {cf.ENV: "AVX2 "}, "readyz", "avx512-bf16")
    assert {k: kp[k] for k in ("ours", "llamacpp", "forced", "ours_from", "requested")} == {
        "ours": "avx2", "llamacpp": "avx2", "forced": True, "ours_from": "readyz",
        "requested": "avx2",
    }  # fmt: skip
    assert "approximat" in kp["note"] and "mismatch" not in kp
    assert "MKL_ENABLE_INSTRUCTIONS=AVX2" in kp["libraries_not_capped"]
    capped = {cf.ENV: "avx2", **cf.LIBRARY_ENV["avx2"]}
    assert "libraries_not_capped" not in lc.kernel_path_info("avx2", "avx2", capped, "readyz")
    for env in ({}, {cf.ENV: "auto"}, {cf.ENV: ""}):
        kp = lc.kernel_path_info("avx512-bf16", "native", env, "local", "avx512-bf16")
        assert kp == {"ours": "avx512-bf16", "llamacpp": "native", "forced": False,
                      "ours_from": "local"}  # fmt: skip


def test_kernel_path_mismatch():
    assert lc.kernel_path_mismatch("avx2", "avx2", "avx512-bf16") is None
    assert lc.kernel_path_mismatch("avx512-bf16", "native", "avx512-bf16") is None
    assert lc.kernel_path_mismatch("avx2", "native", "avx2") is None  # native is AVX2 there
    told = lc.kernel_path_mismatch("avx512-bf16", "avx2", None)
    assert "PREFIXCHAT_CPU_PATH=avx2" in told and "MKL_ENABLE_INSTRUCTIONS=AVX2" in told
    assert "--isa avx2" in lc.kernel_path_mismatch("avx2", "native", "avx512-bf16")


def test_ours_path_of_runs():
    runs = {
        "llamacpp-Q4_1": {"server": "llama.cpp"},
        "ours-int4": {"server": "ours", "cpu_path": "avx2", "cpu_path_from": "readyz"},
        "ours-int8": {"server": "ours", "error": "exited"},
    }
    assert lc.ours_path_of_runs(runs) == ("avx2", "readyz")
    assert lc.ours_path_of_runs({"ours-int8": runs["ours-int8"]}) == (None, None)


def test_table_and_plot_name_the_kernel_paths():
    ours, theirs = lc.figures(_run(0.4, 0.1, 0.02, 8.0)), lc.figures(_run(0.2, 0.1, 0.01, 4.0))
    pair = {"ours_dtype": "int8", "llamacpp_type": "Q8_0", "rows": lc.pair_rows(ours, theirs)}
    kp = lc.kernel_path_info("avx2", "avx2", {cf.ENV: "avx2"}, "readyz")
    text = lc.table([pair], kp)
    assert text.splitlines()[0] == "kernel paths: ours avx2 (forced), llama.cpp avx2"
    assert lc.plot_title(kp) == "Multi-turn TTFT: ours [avx2, forced] vs llama.cpp [avx2]"
    kp = lc.kernel_path_info("avx512-bf16", "avx2", {}, "local")
    assert lc.plot_title(kp) == "Multi-turn TTFT: ours [avx512-bf16] vs llama.cpp [avx2]"
    assert "ours took avx512-bf16" in lc.table([pair], kp).splitlines()[1]


def test_compare_puts_the_kernel_paths_in_the_json(avx512_host, monkeypatch, tmp_path, capsys):
    import inference.loader

    monkeypatch.setenv(cf.ENV, "avx2")
    _fake_built(tmp_path, isa="avx2")
    monkeypatch.setattr(inference.loader, "smollm2_gguf_path", lambda: tmp_path / "m.Q4_1.gguf")
    monkeypatch.setattr(lc.client, "load_client_tokenizer", lambda name: None)
    monkeypatch.setattr(lc, "llama_version", lambda binary: "version: 1")
    started = []

    def fake_pair(contenders, sizes, seed, tokenizer):
        started.extend(c.label for c in contenders)
        runs = {
            "llamacpp-Q4_1": {"server": "llama.cpp", **_run(0.2, 0.1, 0.01, 4.0)},
            "ours-int4": {"server": "ours", **_run(0.4, 0.1, 0.02, 8.0),
                          "cpu_path": "avx2", "cpu_path_from": "readyz"},
        }  # fmt: skip
        for run in runs.values():
            run["decode"]["tpot_s_by_round"] = [0.02]
        runs["llamacpp-Q4_1"]["cold"]["ttft_s_by_round"] = [0.5]
        runs["ours-int4"]["cold"]["ttft_s_by_round"] = [0.45]
        return runs

    monkeypatch.setattr(lc, "measured_pair", fake_pair)
    titles = []
    monkeypatch.setattr(lc, "plot_ttft_by_turn", lambda series, path, title: titles.append(title))
    out = tmp_path / "out.json"
    result = lc.main([
        "compare", "--quick", "--pairs", "int4", "--isa", "avx2", "--cache", str(tmp_path),
        "--out", str(out), "--logs", str(tmp_path / "logs"),
    ])  # fmt: skip
    assert started == ["llamacpp-Q4_1", "ours-int4"]
    kp = json.loads(out.read_text())["kernel_path"]
    assert kp == result["kernel_path"]
    assert {k: kp[k] for k in ("ours", "llamacpp", "forced", "ours_from")} == {
        "ours": "avx2", "llamacpp": "avx2", "forced": True, "ours_from": "readyz"
    }
    assert result["llama_cpp"]["isa"] == "avx2"
    assert result["llama_cpp"]["cmake_flags"] == list(AVX2_FLAGS)
    assert result["llama_cpp"]["binary"] == str(lb.binary(tmp_path, "llama-server", isa="avx2"))
    printed = capsys.readouterr().out
    assert "kernel paths: ours avx2 (forced), llama.cpp avx2" in printed
    # The cold row (--quick: a 256-token prompt) and its ratio by round, in the JSON too.
    written = json.loads(out.read_text())
    (pair,) = written["pairs"]
    cold = next(r for r in pair["rows"] if r["metric"] == "cold_ttft_p50_ms")
    assert cold["label"] == "cold 256-token prompt TTFT p50 (ms)"
    assert cold["ratio"] == pytest.approx(1.0)  # _run's cold TTFTs are the same
    assert pair["cold_ratio_by_round"] == [pytest.approx(0.9)]
    assert "decode_ratio_by_round" in pair and "fresh_over_warm_by_round" in pair
    assert written["runs"]["ours-int4"]["cold"]["ttft_s_by_round"] == [0.45]
    assert written["sizes"]["cold_rounds"] == 1
    assert "cold 256-token prompt TTFT p50 (ms)" in printed
    assert "cold TTFT ours/l.cpp by round: 0.90" in printed
    assert titles == ["Multi-turn TTFT: ours [avx2, forced] vs llama.cpp [avx2]"]
