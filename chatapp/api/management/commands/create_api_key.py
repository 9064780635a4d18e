"""manage.py create_api_key --user NAME [--name LABEL]: prints a new key, once."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from chatapp.api import services


class Command(BaseCommand):
    help = "Create an API key for a user and print it (it is stored only as a hash)."

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="username of the key's owner")
        parser.add_argument("--name", default="", help="a label to recognise the key by")
        parser.add_argument(
            "--allow-cache-salt", action="store_true",
            help="let requests with this key send their own cache_salt",
        )
        parser.add_argument("--rpm", type=int, default=None, help="requests per minute")
        parser.add_argument("--concurrent", type=int, default=None, help="generations at once")

    def handle(self, *args, **options):
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: options["user"]})
        except User.DoesNotExist:
            raise CommandError(f"No user named {options['user']!r}.") from None
        key, raw = services.api_key_create(
            user=user,
            name=options["name"],
            allow_cache_salt=options["allow_cache_salt"],
            rate_limit_rpm=options["rpm"],
            max_concurrent=options["concurrent"],
        )
        self.stderr.write(f"API key {key.prefix} for {options['user']} (shown once, keep it):")
        self.stdout.write(raw)
