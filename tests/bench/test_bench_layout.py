"""The layout of bench/: every command parses its command line with a parser of the
shared layer (bench/cli.py), a shared option is only ever added through it, and no
module imports a command module or another module's private names (the shared
modules hold what several commands need). The parsers are taken from the commands
themselves, stopped at parse_args; the imports are read from the source with `ast`."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

import bench
from bench import cli

BENCH = Path(bench.__file__).resolve().parent
COMMAND_MODULES = set(bench.SUBCOMMANDS.values())
SHARED_FLAGS = {flag for option in cli.OPTIONS.values() for flag in option.flags}


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _command_parser(name: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser `python -m bench NAME` parses its arguments with (nothing runs)."""

    def caught(parser, args=None, namespace=None):
        raise _Parsed(parser)

    def not_shared(parser, args=None, namespace=None):
        raise AssertionError(f"{name}: a parser not made by bench.cli.parser ({parser.prog})")

    monkeypatch.setattr(cli.BenchParser, "parse_args", caught)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", not_shared)
    with pytest.raises(_Parsed) as parsed:
        bench.main([name])
    return parsed.value.parser


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and its subcommands' parsers."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _parsers(sub)
    return out


@pytest.mark.parametrize("name", sorted(bench.SUBCOMMANDS))
def test_every_command_parses_with_the_shared_parser(name, monkeypatch):
    parser = _command_parser(name, monkeypatch)
    assert isinstance(parser, cli.BenchParser)
    assert parser.prog.startswith("python -m bench")
    for p in _parsers(parser):
        assert isinstance(p, cli.BenchParser), p.prog
        for action in p._actions:
            shared = SHARED_FLAGS.intersection(action.option_strings)
            # --out, --threads, --seed ...: one name, type and help in every command.
            assert not shared or getattr(action, "bench_option", None), (p.prog, shared)
            if shared:
                spec = cli.OPTIONS[action.bench_option]
                assert action.option_strings[: len(spec.flags)] == list(spec.flags)
                assert action.type is spec.type and action.help.startswith(spec.help)


def _module_name(path: Path) -> str:
    return "bench" if path.name == "__init__.py" else f"bench.{path.stem}"


def _bench_imports(tree: ast.Module) -> tuple[list[tuple[str, str | None]], dict[str, str]]:
    """([(bench module, name imported from it or None)], {local alias: bench module})."""
    imported: list[tuple[str, str | None]] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("bench."):
                    imported.append((alias.name, None))
                    if alias.asname:
                        aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "bench":
                for alias in node.names:
                    module = f"bench.{alias.name}"
                    if (BENCH / f"{alias.name}.py").exists():  # a module, not bench.main
                        imported.append((module, None))
                        aliases[alias.asname or alias.name] = module
                    else:
                        imported.append(("bench", alias.name))
            elif node.module.startswith("bench."):
                imported += [(node.module, alias.name) for alias in node.names]
    return imported, aliases


def test_no_module_imports_a_command_or_a_private_name():
    """Commands share code through the shared modules only: none imports a command
    module (bench/__init__.py names them as strings), and none reaches for another
    module's _private names, by import or by attribute."""
    problems = []
    for path in sorted(BENCH.glob("*.py")):
        here = _module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        imported, aliases = _bench_imports(tree)
        for module, name in imported:
            if module in COMMAND_MODULES and module != here:
                problems.append(f"{here} imports the command module {module}")
            if name and name.startswith("_") and module != here:
                problems.append(f"{here} imports {module}.{name}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and aliases.get(node.value.id, here) != here
            ):
                problems.append(f"{here} uses {aliases[node.value.id]}.{node.attr}")
    assert not problems, problems


def test_only_the_shared_layer_makes_parsers():
    found = []
    for path in sorted(BENCH.glob("*.py")):
        if path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
            if name == "ArgumentParser":
                found.append(f"{path.name}:{node.lineno}")
    assert not found, found
