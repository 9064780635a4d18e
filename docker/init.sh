#!/bin/sh
# One-shot setup that runs before the web server and the workers start (the compose
# service "init"): the database schema, the first admin account, and the model's config
# and tokenizer read once into the model cache volume and its weights stored there, so that
# no two processes build them at the same time.
set -eu

python manage.py migrate --noinput
python manage.py ensure_admin
python - <<'PY'
import django

django.setup()

from django.conf import settings  # noqa: E402

from inference.loader import resolve_model_path  # noqa: E402

from inference.file_weights import prepare  # noqa: E402

path = resolve_model_path(settings.LLM_MODEL, settings.LLM_MODEL_CACHE)
stored = prepare(settings.LLM_MODEL, settings.LLM_WEIGHT_DTYPE, settings.LLM_MODEL_CACHE)
print(f"Model {settings.LLM_MODEL!r} ready in {path}" + (f", its weights in {stored}" if stored else ""))
PY
