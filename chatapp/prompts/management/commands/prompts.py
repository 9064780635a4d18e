"""`manage.py prompts lint|profile|freeze|list`: the prompt manager's tools."""

from __future__ import annotations

import dataclasses
import functools
import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from chatapp.prompts import lint, presets, profile


@functools.cache
def _tokenizer(model: str):
    from inference.loader import load_tokenizer

    return load_tokenizer(model, getattr(settings, "LLM_MODEL_CACHE", None))


class Command(BaseCommand):
    help = (
        "Prompt templates: lint them, profile recent prompts, freeze preset versions, list presets."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        p = sub.add_parser("lint", help="check templates render the same tokens every time")
        p.add_argument(
            "paths", nargs="*", help="template files or folders (default: every shipped one)"
        )
        p.add_argument("--model", default=None, help="tokenizer to lint with (default: LLM_MODEL)")
        p = sub.add_parser("profile", help="show the first tokens of prompts side by side")
        p.add_argument("--file", help='JSONL, one prompt per line: [ids] or {"token_ids": [...]}')
        p.add_argument("--width", type=int, default=64, help="tokens to show (default 64)")
        p.add_argument("--columns", type=int, default=6, help="prompts side by side (default 6)")
        p.add_argument("--json", action="store_true", help="print the report as JSON")
        p.add_argument("--model", default=None)
        p = sub.add_parser(
            "freeze", help="lint presets and add their current versions to the registry"
        )
        p.add_argument("preset_ids", nargs="*", help="default: every preset")
        p.add_argument("--model", default=None)
        sub.add_parser("list", help="list presets and their registered versions")

    def handle(self, *args, **opts):
        if opts["action"] == "list":
            return self._list()
        tokenizer = _tokenizer(opts.get("model") or settings.LLM_MODEL)
        # The subparsers are required and argparse checks the choice: lint, profile or freeze.
        return getattr(self, "_" + opts["action"])(opts, tokenizer)

    def _lint(self, opts, tokenizer) -> None:
        results = lint.lint_paths(opts["paths"] or None, tokenizer=tokenizer)
        if not results:
            raise CommandError("no templates found")
        for result in results:
            self.stdout.write(result.render_text())
        failed = [r for r in results if not r.ok]
        if failed:
            names = ", ".join(str(r.path) for r in failed)
            raise CommandError(
                f"lint failed for {len(failed)} of {len(results)} templates: {names}"
            )
        self.stdout.write(f"{len(results)} templates ok")

    def _profile(self, opts, tokenizer) -> None:
        if opts["file"]:
            try:
                prompts = profile.load_prompts_jsonl(opts["file"])
            except (OSError, ValueError) as exc:
                raise CommandError(str(exc)) from exc
        else:
            prompts = profile.recent_prompts()
        report = profile.profile_prompts(prompts, tokenizer=tokenizer, width=opts["width"])
        if opts["json"]:
            self.stdout.write(json.dumps(dataclasses.asdict(report), ensure_ascii=False))
        else:
            self.stdout.write(report.render_text(max_columns=opts["columns"]))

    def _freeze(self, opts, tokenizer) -> None:
        folder = presets.presets_dir()
        paths = [folder / f"{pid}.jinja" for pid in opts["preset_ids"]]
        paths = paths or sorted(folder.glob("*.jinja"))
        refused = []
        for path in paths:
            if not path.is_file():
                raise CommandError(f"no preset file {path}")
            result = lint.lint_file(path, tokenizer=tokenizer)
            # Not being frozen yet is what freezing fixes; every other problem blocks it.
            blocking = [p for p in result.problems if p.code != "not-frozen"]
            if blocking:
                result.problems = blocking
                self.stdout.write(result.render_text())
                refused.append(path.stem)
                continue
            preset = presets.load_preset_file(path)
            dest = presets.freeze_preset(preset)
            self.stdout.write(f"frozen {preset.ref} -> {dest}")
        if refused:
            raise CommandError(f"not activated (lint failed): {', '.join(refused)}")

    def _list(self) -> None:
        for preset in presets.list_presets():
            frozen = presets.list_versions(preset.id)
            mark = "" if preset.version in frozen else "  (current version not frozen)"
            self.stdout.write(f"{preset.ref}  {preset.title}{mark}")
            for version in frozen:
                if version != preset.version:
                    self.stdout.write(f"    older: {version}")
