"""Run inside the live server's environment: users, each with a session, a conversation
and an API key, in one process (each manage.py start costs seconds on a busy machine).

    python tests/chatapp/api/seed.py PREFIX '[{"rpm": 2}, {"allow_cache_salt": true}, {}]'
        -> JSON list of {username, user_id, sessionid, conversation_id, key}
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "chatapp" / "e2e"))
sys.path.insert(0, str(ROOT))

import seed as e2e_seed  # noqa: E402  (sets Django up)
from django.contrib.auth import get_user_model  # noqa: E402

from chatapp.api import services  # noqa: E402


def users_with_keys(prefix: str, specs: list[dict]) -> list[dict]:
    out = []
    for i, spec in enumerate(specs):
        [user] = e2e_seed.users(1, f"{prefix}{i}-")
        owner = get_user_model().objects.get(pk=user["user_id"])
        _, key = services.api_key_create(
            user=owner,
            name="test",
            allow_cache_salt=bool(spec.get("allow_cache_salt")),
            rate_limit_rpm=spec.get("rpm"),
            max_concurrent=spec.get("concurrent"),
        )
        out.append({**user, "key": key})
    return out


if __name__ == "__main__":
    print(json.dumps(users_with_keys(sys.argv[1], json.loads(sys.argv[2]))))
