# The Celery app loads with Django, so web processes can queue tasks (`celery -A chatapp`).
from chatapp.celery import app as celery_app

__all__ = ("celery_app",)
