"""The Celery app: `celery -A chatapp worker` runs long generations on its own engine.

Which replies come here, and to which worker, is decided in chatapp.generation (dispatch
and router); the worker's own setup (queue, engine, heartbeat) is in its worker module.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")

app = Celery("chatapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
