"""Create the first admin account if there is none, and say how to log in.

The password comes from $PREFIXCHAT_ADMIN_PASSWORD when set; otherwise one is
generated and printed once (it is not stored anywhere else).
"""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create a first admin account when none exists."

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        username = os.environ.get("PREFIXCHAT_ADMIN_USER", "admin")
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("An admin account exists; log in at http://127.0.0.1:8000/")
            return
        given = os.environ.get("PREFIXCHAT_ADMIN_PASSWORD")
        password = given or secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(self.style.SUCCESS(f"Created admin account {username!r}."))
        how = "$PREFIXCHAT_ADMIN_PASSWORD" if given else (
            f"password {password!r}\n"
            "(set PREFIXCHAT_ADMIN_PASSWORD to choose it; change it under /admin/)"
        )
        self.stdout.write(f"Log in at http://127.0.0.1:8000/ as {username!r} with {how}.")
