"""The command line every `python -m bench` command is built from.

`parser(command, doc)` makes a command's parser; `add(p, name, ...)` gives it a shared
option from OPTIONS, so an option has one flag, type and help in every command that
takes it (a command may pass its own default). Options that only one command has
stay in that command. tests/bench/test_bench_layout.py holds every command to this.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.sizes import ChatShape
from inference.config import DEFAULT_MODEL, WEIGHT_DTYPES

RESULTS = Path("bench-results")
DTYPES = ("auto", "bfloat16", "float32")


class BenchParser(argparse.ArgumentParser):
    """The parser of a bench command (made by `parser`)."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def weight_dtype_list(text: str) -> str:
    """A comma-separated list of weight dtypes (inference.config.WEIGHT_DTYPES), kept as
    written once checked."""
    names = [n.strip() for n in text.split(",")]
    unknown = [n for n in names if n not in WEIGHT_DTYPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"weight dtypes are a comma-separated list of {', '.join(WEIGHT_DTYPES)} "
            f"(got {text!r})"
        )
    return ",".join(names)


@dataclass(frozen=True)
class Option:
    """A shared option. help leaves out the default: `add` appends it, or `unset` (what
    a None default means)."""

    flags: tuple[str, ...]
    help: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    action: str | None = None
    choices: tuple | None = None
    metavar: str | None = None
    unset: str | None = None


OPTIONS: dict[str, Option] = {
    "quick": Option(("--quick",), "smaller sizes, for a first look", action="store_true"),
    "model": Option(
        ("--model",),
        "the default SmolLM2, gemma3-270m, or a local Hugging Face folder or .gguf file",
        default=DEFAULT_MODEL,
        metavar="MODEL",
    ),
    "served_model": Option(
        ("--model",),
        "the model to ask the server for",
        metavar="NAME",
        unset="the first of /v1/models",
    ),
    "dtype": Option(
        ("--dtype",),
        "compute dtype; auto: bfloat16 where the CPU has native bf16 matmuls, else float32",
        choices=DTYPES,
        default="auto",
    ),
    "weight_dtypes": Option(
        ("--weight-dtypes",),
        f"weight dtypes to run, comma-separated, of {', '.join(WEIGHT_DTYPES)}",
        type=weight_dtype_list,
        metavar="LIST",
    ),
    "threads": Option(
        ("--threads",),
        "torch threads",
        type=positive_int,
        metavar="N",
        unset="torch's own choice, one per core",
    ),
    "server_threads": Option(
        ("--threads",),
        "threads of each server started: OMP_NUM_THREADS of ours, -t of llama-server",
        type=positive_int,
        default=2,
        metavar="N",
    ),
    "rounds": Option(
        ("--rounds",),
        "rounds of every measurement; figures are medians over them",
        type=positive_int,
        metavar="N",
    ),
    "iters": Option(
        ("--iters",), "kernel calls timed per round", type=positive_int, metavar="N"
    ),
    "new_tokens": Option(
        ("--new-tokens",), "tokens each sequence generates", type=positive_int, metavar="N"
    ),
    "prompt_tokens": Option(
        ("--tokens",), "tokens of each prompt", type=positive_int, metavar="N"
    ),
    "seed": Option(("--seed",), "seed of the generated text", type=int, default=0, metavar="N"),
    "out": Option(("--out",), "the JSON to write", type=Path, metavar="PATH"),
    "out_png": Option(("--out",), "the PNG to write", type=Path, metavar="PATH"),
    "plot": Option(
        ("--plot",), "the PNG of TTFT by turn to write", type=Path, metavar="PATH", unset="none"
    ),
    "logs": Option(("--logs",), "folder of the servers' logs", type=Path, metavar="DIR"),
    "url": Option(("--url",), "a running server's base URL (with or without /v1)", metavar="URL"),
    "api_key": Option(
        ("--api-key",), "the server's API key", metavar="KEY", unset="$OPENAI_API_KEY"
    ),
    # The shape of a chat workload (bench/sizes.py holds the usual ones).
    "num_conversations": Option(
        ("--num-conversations",),
        "conversations (one-turn workloads: requests; with --conversations, at most this "
        "many lines)",
        type=positive_int,
        metavar="N",
    ),
    "turns": Option(("--turns",), "user turns per conversation", type=positive_int, metavar="N"),
    "system_tokens": Option(
        ("--system-tokens",),
        "tokens of the shared system prompt (random workload: of each request's own)",
        type=positive_int,
        metavar="N",
    ),
    "user_tokens": Option(
        ("--user-tokens",), "tokens of each user turn", type=positive_int, metavar="N"
    ),
    "reply_tokens": Option(
        ("--reply-tokens",), "tokens of each reply (max_tokens)", type=positive_int, metavar="N"
    ),
    "concurrency": Option(
        ("--concurrency",),
        "conversations in flight at once",
        type=positive_int,
        metavar="N",
        unset="all of them",
    ),
    "conversations": Option(
        ("--conversations",),
        "a JSONL file of message lists, replayed instead of the generated chats",
        type=Path,
        metavar="FILE",
    ),
}

# The chat shape's options, in the order --help lists them.
CHAT_SHAPE = ("num_conversations", "turns", "system_tokens", "user_tokens", "reply_tokens")
# Said in --help where a chat-shape option's default is None.
FROM_SIZES = "the command's sizes, --quick's with --quick"


def parser(command: str, doc: str, **kw: Any) -> BenchParser:
    """A command's parser: `python -m bench COMMAND`, its description the docstring's
    first paragraph and its epilog the rest, as written."""
    first, _, rest = doc.strip("\n").partition("\n\n")
    return BenchParser(
        prog=f"python -m bench {command}".rstrip(),
        description=first,
        epilog=rest.strip("\n") or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kw,
    )


def add(
    p: argparse.ArgumentParser,
    name: str,
    default: Any = ...,
    *,
    default_text: str | None = None,
    required: bool = False,
    aliases: tuple[str, ...] = (),
) -> argparse.Action:
    """Add the shared option `name` to `p`, with this command's default where given.
    default_text: what --help says of a None default, where the option's own `unset`
    does not fit. aliases: older spellings a command still accepts."""
    spec = OPTIONS[name]
    value = spec.default if default is ... else default
    text = spec.help
    if spec.action != "store_true" and not required:
        said = default_text or (spec.unset if value is None else "%(default)s")
        if said:
            text = f"{text} (default: {said})"
    kw: dict[str, Any] = {"help": text, "default": value}
    if spec.action:
        kw["action"] = spec.action
    else:
        kw.update(type=spec.type, choices=spec.choices, metavar=spec.metavar)
    if required:
        kw["required"] = True
    action = p.add_argument(*spec.flags, *aliases, **kw)
    action.bench_option = name  # what tests/bench/test_bench_layout.py looks for
    return action


def add_chat_shape(
    p: argparse.ArgumentParser,
    defaults: ChatShape | None = None,
    names: tuple[str, ...] = CHAT_SHAPE,
) -> None:
    """The chat shape's options (`names` of CHAT_SHAPE), their defaults taken from
    `defaults`, or None: the command's sizes decide."""
    for name in names:
        field = "conversations" if name == "num_conversations" else name
        if defaults is None:
            add(p, name, None, default_text=FROM_SIZES)
        else:
            add(p, name, getattr(defaults, field))


def overrides(args: argparse.Namespace, fields: dict[str, str]) -> dict[str, Any]:
    """{sizes field: value} of the options (dest -> field) given on the command line,
    for dataclasses.replace of a command's sizes."""
    given = {field: getattr(args, dest) for dest, field in fields.items()}
    return {field: value for field, value in given.items() if value is not None}


def engine_dtype(name: str) -> str:
    """`--dtype` as the engine takes it: auto resolved for this CPU."""
    from inference.config import default_dtype

    return default_dtype("cpu") if name == "auto" else name


def set_threads(threads: int | None) -> None:
    """torch's thread count, where `--threads` gave one."""
    if threads:
        import torch

        torch.set_num_threads(threads)
