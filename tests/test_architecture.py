"""The import directions of docs/ARCHITECTURE.md, checked on the source with `ast`:
no cycle between chatapp's packages, and no import the design forbids (function-local
imports count as much as module-level ones)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = ("chatapp", "inference", "kernels", "bench")


def _package(module: str) -> str:
    """chatapp.chat.services -> chatapp.chat; a module of chatapp's own (chatapp.celery,
    chatapp.urls: the project's wiring) stands for itself; other top-level packages as
    they are."""
    parts = module.split(".")
    if parts[0] == "chatapp" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path).split(".")
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_package else here[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in TOP}


def _graph() -> dict[str, set[str]]:
    """Package -> the packages its modules import (migrations excluded: generated)."""
    graph: dict[str, set[str]] = {}
    for top in TOP:
        for path in (ROOT / top).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            source = _package(_module_name(path))
            targets = {_package(m) for m in _imports(path)}
            graph.setdefault(source, set()).update(targets - {source})
    return graph


GRAPH = _graph()

FORBIDDEN = [
    # (importer prefix, imported prefix)
    ("inference", "chatapp"),
    ("inference", "django"),
    ("kernels", "chatapp"),
    ("kernels", "django"),
    ("kernels", "inference"),
    ("kernels", "bench"),
    ("inference", "bench"),
    ("chatapp", "bench"),
    ("chatapp.chat", "chatapp.generation"),
    ("chatapp.chat", "chatapp.web"),
    ("chatapp.chat", "chatapp.api"),
    ("chatapp.chat", "chatapp.dashboard"),
    ("chatapp.prompts", "chatapp.chat"),
    ("chatapp.prompts", "chatapp.generation"),
    ("chatapp.prompts", "chatapp.web"),
    ("chatapp.prompts", "chatapp.api"),
    ("chatapp.prompts", "chatapp.dashboard"),
    ("chatapp.generation", "chatapp.web"),
    ("chatapp.generation", "chatapp.api"),
    ("chatapp.generation", "chatapp.dashboard"),
    ("chatapp.dashboard", "chatapp.web"),
    ("chatapp.dashboard", "chatapp.api"),
]


def _django_importers() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for top in ("inference", "kernels"):
        for path in (ROOT / top).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                if any(n.split(".")[0] in ("django", "channels", "celery") for n in names):
                    out.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return out


@pytest.mark.parametrize(("importer", "imported"), FORBIDDEN)
def test_no_forbidden_direction(importer, imported):
    if imported == "django":
        assert importer not in _django_importers(), _django_importers().get(importer)
        return
    offenders = [
        source for source, targets in GRAPH.items()
        if (source == importer or source.startswith(importer + "."))
        and any(t == imported or t.startswith(imported + ".") for t in targets)
    ]
    assert not offenders, f"{offenders} import {imported}"


def test_no_cycle_between_chatapp_packages():
    nodes = {n for n in GRAPH if n.startswith("chatapp")}
    edges = {n: {t for t in GRAPH[n] if t in nodes} for n in nodes}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(nodes):
        if node not in state:
            visit(node)


def test_the_walk_sees_the_packages():
    # A walk that found nothing would pass every check above.
    assert {"chatapp.chat", "chatapp.generation", "chatapp.web", "chatapp.api",
            "chatapp.prompts", "chatapp.dashboard", "inference", "kernels"} <= set(GRAPH)
    assert "chatapp.chat" in GRAPH["chatapp.generation"]
    assert "kernels" in GRAPH["inference"]


def _callers_of(name: str, *, imports: bool = True) -> set[str]:
    """chatapp modules that call `name` (or import it, with imports)."""
    found = set()
    for path in (ROOT / "chatapp").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            called = isinstance(node, ast.Call) and (
                getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name
            )
            imported = imports and isinstance(node, ast.ImportFrom) and any(
                a.name == name for a in node.names
            )
            if called or imported:
                found.add(_module_name(path))
    return found


def test_one_prompt_builder_per_tokenizer():
    # The process's builders come from builder_for (the linter builds its own, for a
    # format and folder it is given); another cache would encode every system prompt again.
    assert _callers_of("PromptBuilder", imports=False) == {"chatapp.prompts.services", "chatapp.prompts.lint"}


def test_one_start_up_module_for_daphne_and_the_worker():
    for name in ("start_sampler", "preload_in_background"):
        assert _callers_of(name) == {"chatapp.startup"}, name


# --- the KV tier is the manager's collaborator, never its reader -------------------
MANAGER = ROOT / "inference" / "kv_cache_manager.py"
TIER = ROOT / "inference" / "kv_offload.py"
POOL = ROOT / "inference" / "block_pool.py"


def _members(source: str, classes: set[str] | None = None) -> set[str]:
    """What the module's classes (or those named) define: methods, and attributes set on
    self anywhere in the class."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef) or (classes is not None and node.name not in classes):
            continue
        out.update(f.name for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef))
        out.update(
            a.attr for a in ast.walk(node)
            if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Store)
            and isinstance(a.value, ast.Name) and a.value.id == "self"
        )
    return out


def _reaches_into_manager(source: str) -> list[str]:
    """Where `source` imports the manager, names it, or reads or writes one of its members.
    Names the pool and its blocks also define are allowed: the manager hands the tier its
    pool as an argument (BlockPool.enable_caching is not the manager's)."""
    manager_only = _members(MANAGER.read_text(), {"KVCacheManager"}) - _members(POOL.read_text())
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or "", *(a.name for a in node.names)]
        else:
            modules = []
        if any("kv_cache_manager" in m or m == "KVCacheManager" for m in modules):
            found.append(f"line {node.lineno}: imports the manager")
        elif isinstance(node, ast.Name) and node.id == "KVCacheManager":
            found.append(f"line {node.lineno}: names KVCacheManager")
        elif isinstance(node, ast.Attribute) and node.attr in manager_only:
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_the_kv_tier_does_not_touch_the_managers_fields():
    # KVCacheManager owns the tier and calls it, passing the pool and hashes it needs;
    # a tier that reads the manager from below couples the two layers again.
    assert _reaches_into_manager(TIER.read_text()) == []


def test_the_tier_rule_catches_a_reach_into_the_manager():
    # The shape the tier had before: free functions taking the manager as `kv`.
    assert {"pool", "tier", "history"} <= _members(MANAGER.read_text(), {"KVCacheManager"})
    old = ("def prewarm(kv, seq, n):\n"
           "    kv.update_block_hashes(seq)\n"
           "    return kv.tier.restores + kv.pool.num_blocks\n")
    assert {f.split(": ")[1] for f in _reaches_into_manager(old)} == {
        ".tier", ".pool", ".update_block_hashes"}  # .num_blocks is the pool's: allowed
    assert _reaches_into_manager("from inference.kv_cache_manager import KVCacheManager\n")
    assert _reaches_into_manager("def f(pool):\n    return pool.enable_caching\n") == []
