"""Real Celery workers for the worker tests: `celery worker` processes, a daphne web
process, PostgreSQL (the test database, shared by every process) and Redis.

Never eager mode: tasks go through the broker to worker processes that host their own
engine. Skipped unless DATABASE_URL names PostgreSQL and REDIS_URL is set (as in CI):
a worker in another process can only see the test's rows in a shared database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.test import Client

from tests.chatapp.e2e.conftest import (
    ARTIFACTS,
    ROOT,
    _free_port,
    _wait_until_serving,
    spawn_daphne,
    stop_live_server,
)
from tests.inference.conftest import make_tiny_model

CELERY = str(Path(sys.executable).with_name("celery"))
# The worker tests' Redis database: apart from the one other tests' live servers use.
WORKER_REDIS_DB = os.environ.get("WORKER_TEST_REDIS_DB", "9")
# Bounds a hung test only; a reply takes seconds.
WAIT_S = 120


def _require_services() -> tuple[str, str]:
    database = os.environ.get("DATABASE_URL", "")
    redis_url = os.environ.get("REDIS_URL", "")
    if not database.startswith(("postgres://", "postgresql://")) or not redis_url:
        pytest.skip("worker tests need DATABASE_URL (PostgreSQL) and REDIS_URL")
    return database, redis_url


def redis_url_with_db(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


def shared_database_url() -> str:
    """The URL of the database pytest-django made for this session (every process uses it)."""
    from django.db import connection

    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def redis_client(url: str):
    import redis

    return redis.Redis.from_url(url, socket_timeout=5)


@dataclass
class Worker:
    name: str  # the Celery nodename, also its engine id and `served_by`
    proc: subprocess.Popen
    log: Path

    def kill(self) -> None:
        """kill -9 of the whole worker: the main process and its pool child."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def kill_pool_child(self) -> None:
        """kill -9 of the pool child only (the process running the task)."""
        children = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        assert len(children) == 1, children
        os.kill(int(children[0]), signal.SIGKILL)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class Cluster:
    """A web process and workers sharing the test database, one broker and one layer."""

    env: dict
    broker_url: str
    shared_queue: str
    web_url: str = ""
    web_proc: subprocess.Popen | None = None
    web_log: Path | None = None
    workers: dict[str, Worker] = field(default_factory=dict)
    _app: object = None

    @property
    def ws_url(self) -> str:
        return self.web_url.replace("http://", "ws://")

    @property
    def app(self):
        """A Celery client on the cluster's broker (to send tasks and control workers)."""
        if self._app is None:
            from celery import Celery

            self._app = Celery("worker-tests", broker=self.broker_url)
        return self._app

    def own_queue(self, worker: Worker) -> str:
        return f"{self.shared_queue}.{worker.name}"

    def start_web(self, name: str, **overrides: str) -> None:
        port = _free_port()
        env = {**self.env, **overrides}
        self.web_log = ARTIFACTS / f"{name}-web.log"
        self.web_proc, self.web_url = spawn_daphne(env, port, self.web_log)
        _wait_until_serving(self.web_url, self.web_proc, self.web_log)

    def start_worker(self, label: str, **overrides: str) -> Worker:
        name = f"{label}-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        log = ARTIFACTS / f"worker-{label}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                # The command a deployment runs, plus two flags that only save start-up time.
                [CELERY, "-A", "chatapp", "worker", "--loglevel=info", "--concurrency=1",
                 f"--hostname={name}", "--without-mingle", "--without-gossip"],
                env={**self.env, **overrides}, cwd=ROOT, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        worker = Worker(name=name, proc=proc, log=log)
        self.workers[name] = worker
        return worker

    def wait_ready(self, *workers: Worker) -> None:
        """Until each worker's pool child beats in the registry with its engine loaded, so
        that no test's generation includes loading the model."""
        key = f"prefixchat:workers:{self.shared_queue}"
        redis = redis_client(self.broker_url)
        deadline = time.monotonic() + WAIT_S

        def ready(name: str) -> bool:
            record = redis.hget(key, name)
            return bool(record) and json.loads(record).get("ready", False)

        for worker in workers:
            while not ready(worker.name):
                if worker.proc.poll() is not None:
                    raise RuntimeError(f"worker exited:\n{worker.log.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker not ready:\n{worker.log.read_text()[-3000:]}")
                time.sleep(0.2)

    def send_task(self, reply_id: int, queue: str) -> str:
        result = self.app.send_task("chatapp.generation.generate_reply", args=[reply_id],
                                    queue=queue)
        return result.id

    def control(self, command: str, worker: Worker, queue: str) -> None:
        reply = getattr(self.app.control, command)(queue, destination=[worker.name],
                                                   reply=True, timeout=10)
        assert reply, f"{worker.name} did not answer {command}"

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        if self.web_proc is not None:
            stop_live_server(self.web_proc)
        with contextlib.suppress(Exception):
            redis = redis_client(self.broker_url)
            keys = list(redis.scan_iter(f"{self.shared_queue}*"))
            keys += list(redis.scan_iter(f"_kombu.binding*.{self.shared_queue}*"))
            redis.delete(f"prefixchat:workers:{self.shared_queue}", *keys)


def cluster_env(broker_url: str, layer_url: str, shared_queue: str) -> dict:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "chatapp.settings",
        "DATABASE_URL": shared_database_url(),
        "REDIS_URL": layer_url,
        "CELERY_BROKER_URL": broker_url,
        "CELERY_SHARED_QUEUE": shared_queue,
        # Every process signs and salts alike (sessions, tenants' cache salts).
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        "CHAT_TEMPERATURE": "0",
        "CHAT_MAX_NEW_TOKENS": "48",
        # Titles would be extra tasks after each first reply; a test turns them on.
        "CHAT_TITLES": "0",
        "CHAT_STREAM_BATCH_TOKENS": "4",
        # Every chat reply is "long": the web process never generates (nor loads a model).
        "CELERY_REPLY_MIN_TOKENS": "1",
        "LLM_PRELOAD": "0",
        "DASHBOARD_SAMPLE_INTERVAL_S": "0",
        "OMP_NUM_THREADS": "1",
        # A small KV pool each: quicker to set up, and two workers share the machine.
        "LLM_NUM_BLOCKS": "256",
        "LLM_MAX_NUM_SEQS": "4",
        # Short beats and timeouts, so a killed worker is noticed in seconds, not an hour
        # (yet above a generation here, with room for two loaded cores: a task redelivered
        # while its worker still runs it waits, but a test expects none).
        "CHAT_HEARTBEAT_S": "0.3",
        "CHAT_ORPHAN_S": "5",
        "CHAT_ORPHAN_SWEEP_S": "1",
        # A queued reply waits for a worker whose fresh child may still be loading.
        "CHAT_STALE_REPLY_S": "60",
        "CHAT_STOP_POLL_S": "0.2",
        "CELERY_WORKER_HEARTBEAT_S": "1",
        "CELERY_VISIBILITY_TIMEOUT": "12",
        "CELERY_AFFINITY_MAX_QUEUE": "1",
    }
    env.pop("DJANGO_DEBUG", None)
    return env


@pytest.fixture(scope="module")
def cluster(django_db_setup, django_db_blocker):
    """daphne and two workers, A and B, for the module; torn down at its end."""
    _, redis_url = _require_services()
    ARTIFACTS.mkdir(exist_ok=True)
    layer_url = redis_url_with_db(redis_url, WORKER_REDIS_DB)
    shared = f"gen-test-{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock():
        c = Cluster(env=cluster_env(layer_url, layer_url, shared), broker_url=layer_url,
                    shared_queue=shared)
    try:
        a, b = c.start_worker("a"), c.start_worker("b")
        c.start_web("workers")
        c.wait_ready(a, b)
        yield c
    finally:
        c.stop()


@contextlib.contextmanager
def tiny_worker(django_db_blocker, model_dir, name: str, **settings: str):
    """One worker serving the tiny random model (in model_dir) with `settings` on top of
    the cluster's, ready; stopped on leaving."""
    _, redis_url = _require_services()
    ARTIFACTS.mkdir(exist_ok=True)
    model = make_tiny_model(model_dir, "llama", seed=3)
    layer_url = redis_url_with_db(redis_url, WORKER_REDIS_DB)
    shared = f"gen-test-{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock():
        env = cluster_env(layer_url, layer_url, shared)
    env.update(LLM_MODELS=f"tiny={model}", LLM_MAX_MODEL_LEN="1024", **settings)
    c = Cluster(env=env, broker_url=layer_url, shared_queue=shared)
    try:
        c.wait_ready(c.start_worker(name))
        yield c
    finally:
        c.stop()


@pytest.fixture
def private_redis():
    """A redis-server of the test's own on a spare port, which the test may stop and
    start again without disturbing anything else."""
    _require_services()
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = _free_port()
    server = PrivateRedis(binary, port)
    server.start()
    yield server
    server.stop()


class PrivateRedis:
    def __init__(self, binary: str, port: int):
        self.binary, self.port, self.proc = binary, port, None
        self.url = f"redis://127.0.0.1:{port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(Exception):
                if redis_client(self.url).ping():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("private redis-server did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # like a crash: nothing saved, connections cut
            self.proc.wait()


# -- helpers the tests share -------------------------------------------------------


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


async def ws_exchange(url: str, cookie: str, frames: list[dict], until) -> list[dict]:
    """Open the chat socket, send `frames`, collect events until until(events) holds."""
    from websockets.asyncio.client import connect

    headers = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}",
               "Origin": url.replace("ws://", "http://").split("/ws/")[0]}
    events: list[dict] = []
    async with connect(url, additional_headers=headers, open_timeout=30) as ws:
        events.append(json.loads(await asyncio.wait_for(ws.recv(), WAIT_S)))  # hello
        for frame in frames:
            await ws.send(json.dumps(frame))
        while not until(events):
            events.append(json.loads(await asyncio.wait_for(ws.recv(), WAIT_S)))
    return events


def wait_for(predicate, timeout: float = WAIT_S, interval: float = 0.2, what: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(interval)
