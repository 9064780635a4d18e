"""The Celery app: `celery -A chatapp worker` runs long generations on its own engine.

Configured from Django settings (the CELERY_* names); tasks live in each app's
tasks.py. Which replies come here, and to which worker, is decided in
chatapp.generation (dispatch and router); the worker's own setup (its queue, its
engine, its heartbeat) is in chatapp.generation.worker.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")

app = Celery("chatapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
