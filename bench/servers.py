"""The servers the server benchmarks start and stop: ours (daphne on this repository, as
`make run` serves) and llama.cpp's llama-server, each on a free loopback port, its log
in a file; and which kernel path ours took."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.report import progress_log
from inference.config import DEFAULT_MODEL
from kernels import cpu_features as cf

ROOT = Path(__file__).resolve().parents[1]
SERVED_NAME = DEFAULT_MODEL  # llama-server's alias, so both list the same model name


log = progress_log("bench servers", clock=False)


@dataclass(frozen=True)
class ServerSettings:
    threads: int = 2
    ctx: int = 65536
    parallel: int = 16


# --- servers -------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server_cmd(binary: Path, model: Path, port: int, s: ServerSettings) -> list[str]:
    return [
        str(binary),
        "-m", str(model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "-t", str(s.threads),
        "-tb", str(s.threads),
        "-c", str(s.ctx),
        "--parallel", str(s.parallel),
        # One KV pool shared by the slots (like our paged pool) instead of ctx/parallel each.
        "--kv-unified",
        # On by default; named so the comparison does not depend on a default.
        "--cache-prompt",
        "--no-webui",
        "-a", SERVED_NAME,
    ]  # fmt: skip


def ours_env(dtype: str, database: Path, s: ServerSettings) -> dict:
    """Our server's environment: its own SQLite file, no Redis or Celery, the model
    loading at start, room in the API limits for the workloads' concurrency."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "chatapp.settings",
        "DATABASE_URL": f"sqlite:///{database}",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(32),
        "LLM_PRELOAD": "1",
        "LLM_WEIGHT_DTYPE": dtype,
        "LLM_MAX_NUM_SEQS": str(s.parallel),
        "OMP_NUM_THREADS": str(s.threads),
        "DASHBOARD_SAMPLE_INTERVAL_S": "0",
        "API_RATE_LIMIT_RPM": "1000000",
        "API_MAX_CONCURRENT": str(4 * s.parallel),
        "PREFIXCHAT_ADMIN_USER": "bench",
        "PREFIXCHAT_ADMIN_PASSWORD": secrets.token_urlsafe(16),
    }
    for name in ("DJANGO_DEBUG", "REDIS_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    return env


@dataclass
class Server:
    label: str
    url: str
    proc: subprocess.Popen
    log: Path
    startup_s: float
    api_key: str | None = None
    # Our server's kernel path and where it was read ("readyz" or "local").
    cpu_path: str | None = None
    cpu_path_from: str | None = None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_ready(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    """Poll `url` until it answers 200; bounded, and failing fast if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"server exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.5)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s; see {log_path}")


def start_llama_server(
    binary: Path, model: Path, label: str, s: ServerSettings, logs: Path, timeout_s: float = 600,
    extra_args: tuple[str, ...] = (),
) -> Server:
    """llama-server on `model`; `extra_args` go after the usual ones (--context-shift)."""
    port = free_port()
    log_path = logs / f"{label}.log"
    started = time.perf_counter()
    with open(log_path, "w") as out:
        proc = subprocess.Popen(
            [*llama_server_cmd(binary, model, port, s), *extra_args],
            cwd=binary.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/health", proc, log_path, timeout_s)
    return Server(label, url, proc, log_path, time.perf_counter() - started)


def readyz_cpu_path(url: str, timeout_s: float = 5) -> str | None:
    """The `cpu_path` of our server's /readyz JSON (top level, or its model check's,
    where the dashboard reports the loaded engine's), None where it has none (an older
    server) or does not answer."""
    return readyz_field(url, "cpu_path", timeout_s)


def readyz_field(url: str, name: str, timeout_s: float = 5) -> str | None:
    """A string field of our server's /readyz JSON that names how its engine runs
    (cpu_path, dtype, weight_dtype, kv_dtype), as readyz_cpu_path finds it."""
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=timeout_s) as response:
            body = json.loads(response.read())
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    checks = body.get("checks")
    model = checks.get("model") if isinstance(checks, dict) else None
    for where in (body, model if isinstance(model, dict) else {}):
        value = where.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def local_cpu_path(env: Mapping[str, str]) -> str:
    """kernels.cpu_features.cpu_path() as a process with `env` takes it. The path hangs
    on the CPU and $PREFIXCHAT_CPU_PATH alone, so it is evaluated here with that one
    variable set as in `env`, past the cache (this process's own path may have been
    taken under another value); os.environ is restored after."""
    saved = os.environ.get(cf.ENV)
    try:
        if cf.ENV in env:
            os.environ[cf.ENV] = env[cf.ENV]
        else:
            os.environ.pop(cf.ENV, None)
        return cf.cpu_path.__wrapped__()
    finally:
        if saved is None:
            os.environ.pop(cf.ENV, None)
        else:
            os.environ[cf.ENV] = saved


def ours_cpu_path(url: str, env: Mapping[str, str]) -> tuple[str, str]:
    """(path, where from): the server's own word where /readyz gives it, else computed."""
    if path := readyz_cpu_path(url):
        return path, "readyz"
    return local_cpu_path(env), "local"


def _manage(env: dict, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "manage.py", *args], env=env, cwd=ROOT, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout


def start_ours(
    dtype: str, label: str, s: ServerSettings, logs: Path, database: Path, timeout_s: float = 600,
    extra_env: Mapping[str, str] | None = None,
) -> Server:
    """daphne on this repository with a fresh database and one API key, as `make run`;
    `extra_env` sets more of its settings (LLM_MAX_MODEL_LEN)."""
    env = {**ours_env(dtype, database, s), **(extra_env or {})}
    _manage(env, "migrate", "--noinput", "-v", "0")
    _manage(env, "ensure_admin")
    key = _manage(
        env, "create_api_key", "--user", "bench", "--name", "bench",
        "--rpm", "1000000", "--concurrent", str(4 * s.parallel),
    ).strip().splitlines()[-1]  # fmt: skip
    port = free_port()
    log_path = logs / f"{label}.log"
    daphne = str(Path(sys.executable).with_name("daphne"))
    started = time.perf_counter()
    with open(log_path, "w") as out:
        proc = subprocess.Popen(
            [daphne, "-b", "127.0.0.1", "-p", str(port), "chatapp.asgi:application"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url + "/readyz", proc, log_path, timeout_s)
    startup_s = time.perf_counter() - started
    path, path_from = ours_cpu_path(url, env)
    log(f"{label}: kernel path {path} (from {path_from})")
    return Server(label, url, proc, log_path, startup_s, key, path, path_from)
