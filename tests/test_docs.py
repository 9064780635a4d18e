"""The README is a short front door and docs/ hold the rest: every environment variable
is documented once, in docs/configuration.md, against what the code and the compose file
read, and every link of the README and the docs resolves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.test_deploy import raw_compose, settings_variables, variables_used

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
REFERENCE = DOCS / "configuration.md"
PAGES = sorted(DOCS.glob("*.md"))

ROW = re.compile(r"^\|\s*`([A-Z][A-Z0-9_]*)`\s*\|(.*)\|\s*$")
# Where the code reads a variable: os.environ.get / [] / setdefault, os.getenv, env_bool.
READ = re.compile(
    r"""(?:os\.environ(?:\.get|\.setdefault|\.pop)?\s*[(\[]|os\.getenv\(|env_bool\()"""
    r"""\s*["']([A-Z][A-Z0-9_]*)["']"""
)
CODE_DIRS = ("chatapp", "inference", "kernels", "bench")


# -- the reference's rows ----------------------------------------------------------------------


def reference_rows() -> list[tuple[str, str, list[str]]]:
    """(section, variable, [default, what it does, docker compose]) for every table row,
    the section being the level-2 heading above it."""
    rows, section = [], ""
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif m := ROW.match(line):
            cells = [c.strip() for c in m[2].split(" | ")]
            assert len(cells) == 3, f"{m[1]}: expected default | what it does | docker compose"
            rows.append((section, m[1], cells))
    return rows


def documented(section_prefix: str = "") -> dict[str, list[str]]:
    return {n: c for s, n, c in reference_rows() if s.startswith(section_prefix)}


def settings_reads() -> set[str]:
    """What chatapp/settings.py reads: the os.environ / env_bool names, and DATABASE_URL
    through dj-database-url."""
    source = (ROOT / "chatapp" / "settings.py").read_text()
    names = settings_variables()
    if "dj_database_url.config(" in source:
        names.add("DATABASE_URL")
    return names


def code_reads() -> dict[str, set[str]]:
    """Every variable a module of the project reads by name -> the files that read it."""
    files = [p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py")] + [ROOT / "manage.py"]
    found: dict[str, set[str]] = {}
    for path in files:
        text = path.read_text()
        names = set(READ.findall(text))
        # A name kept in a module constant: kernels/cpu_features.py's ENV,
        # kernels/quant_linear.py's PREFILL_GEMM_ENV.
        names |= set(re.findall(r'^(?:[A-Z_]+_)?ENV = "([A-Z][A-Z0-9_]*)"', text, re.M))
        for name in names:
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_reference_parses_and_each_variable_is_documented_once():
    rows = reference_rows()
    assert len(rows) > 60
    names = [n for _, n, _ in rows]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"documented more than once in docs/configuration.md: {twice}"
    for _, name, (default, what, compose) in rows:
        assert default and what and compose, name


def test_the_application_settings_are_exactly_what_settings_py_reads():
    listed = set(documented("Application settings"))
    reads = settings_reads()
    assert reads - listed == set(), (
        f"settings.py reads these; docs/configuration.md lacks them: {sorted(reads - listed)}"
    )
    assert listed - reads == set(), (
        f"listed as application settings, not read by settings.py: {sorted(listed - reads)}"
    )


def test_every_variable_the_code_reads_is_in_the_reference():
    reads = code_reads()
    missing = sorted(set(reads) - set(documented()))
    assert not missing, f"read by the code, not in docs/configuration.md: {missing}"
    # ...and what the reference says is read elsewhere in the code is read there.
    elsewhere = set(documented("Read elsewhere"))
    outside_settings = {n for n, files in reads.items() if files != {"chatapp/settings.py"}}
    stale = sorted(elsewhere - outside_settings)
    assert not stale, f"listed as read by the code, read nowhere outside settings.py: {stale}"


def _literal_defaults() -> dict[str, str]:
    """settings.py's defaults that are literals: os.environ.get(NAME, "x"), str(<int>)
    and env_bool(NAME[, True|False]), as the strings the environment would hold."""
    tree = ast.parse((ROOT / "chatapp" / "settings.py").read_text())
    out = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = node.args[0]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        func = ast.unparse(node.func)
        default = node.args[1] if len(node.args) > 1 else None
        if func == "env_bool":
            value = default.value if isinstance(default, ast.Constant) else False
            out[name.value] = "1" if value else "0"
        elif func == "os.environ.get" and default is not None:
            if isinstance(default, ast.Constant) and isinstance(default.value, str):
                out[name.value] = default.value
            elif (isinstance(default, ast.Call) and ast.unparse(default.func) == "str"
                  and isinstance(default.args[0], ast.Constant)):
                out[name.value] = str(default.args[0].value)
        elif func == "os.environ.get":
            out[name.value] = ""
    return out


def test_defaults_in_the_reference_are_the_ones_settings_py_gives():
    rows = documented("Application settings")
    defaults = _literal_defaults()
    assert len(defaults) > 40
    wrong = []
    for name, value in defaults.items():
        if name not in rows:
            continue  # test_the_application_settings_are_exactly_what_settings_py_reads
        cell = rows[name][0]
        if value in ("", "0") and cell.startswith("unset"):
            continue  # unset, or 0 read as "unset": the engine's or the code's own default
        if f"`{value}`" not in cell:
            wrong.append(f"{name}: settings.py {value!r}, docs {cell!r}")
    assert not wrong, "\n".join(wrong)


def _compose_kind(name: str, doc: dict) -> str:
    shared = doc["x-app-environment"]
    # The application's services (the postgres image reads POSTGRES_* for itself).
    services = [s.get("environment") or {} for n, s in doc["services"].items()
                if n not in ("postgres", "redis")]
    if name in shared:
        return "passed through" if shared[name] is None else "set by compose"
    if any(name in env and env[name] is None for env in services):
        return "passed through"
    if any(name in env for env in services):
        return "set per service"
    if name in variables_used(doc):
        return "compose variable"
    if name.startswith("COMPOSE_"):
        return "read by compose"
    return "not passed"


def test_the_compose_column_says_what_docker_compose_yml_does():
    doc = raw_compose()
    wrong = [
        f"{name}: docs say {compose!r}, the compose file: {_compose_kind(name, doc)}"
        for _, name, (_, _, compose) in reference_rows()
        if not compose.startswith(_compose_kind(name, doc))
    ]
    assert not wrong, "\n".join(wrong)


# -- the README and the links ------------------------------------------------------------------


def test_the_readme_is_a_short_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines"
    text = "\n".join(lines)
    for must in ("make run", "make test", "docs/img/", "base_url"):
        assert must in text, must
    # It links every page of docs/.
    for page in PAGES:
        assert f"docs/{page.name}" in text, f"README.md does not link docs/{page.name}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out, seen, fenced = set(), {}, False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not (m := re.match(r"^#{1,6} (.+)$", line)):
            continue
        base = slug(m[1])
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


LINK = re.compile(r"\]\(([^)\s]+)\)|<img [^>]*src=\"([^\"]+)\"")


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_every_link_resolves(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    links = [a or b for a, b in LINK.findall(text)]
    broken = []
    for link in links:
        if re.match(r"^[a-z]+:", link):  # http(s), mailto: not followed here
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        missing_anchor = anchor and target.suffix == ".md" and anchor not in anchors(target)
        if not target.exists() or missing_anchor:
            broken.append(link)
    assert not broken, f"{page.name}: broken links {broken}"


def test_screenshots_are_small_pngs():
    images = sorted((DOCS / "img").glob("*.png"))
    assert images, "no screenshots under docs/img/"
    for image in images:
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", image.name
        assert image.stat().st_size < 300_000, f"{image.name}: keep screenshots small"
