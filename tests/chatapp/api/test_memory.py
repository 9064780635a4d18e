"""The remembered-ids splice: an assistant text this tenant's replies produced comes back as
exactly the ids generated for it; other tenants' memories and expired ones are not used."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from chatapp.api import services
from chatapp.api.models import RememberedReply
from chatapp.api.v1 import completions
from chatapp.api.v1.parsing import parse_completion_request
from tests.chatapp.api.conftest import MODEL

REPLY = "Hello! How can I help?"


@pytest.fixture(scope="module")
def tokenizer():
    from django.conf import settings

    from inference.loader import load_tokenizer

    return load_tokenizer(settings.LLM_MODEL, settings.LLM_MODEL_CACHE)


def _request(**extra):
    return parse_completion_request({
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": REPLY},
            {"role": "user", "content": "Thanks"},
        ],
        "max_tokens": 4,
        **extra,
    })


def _generated_ids(tokenizer) -> list[int]:
    # As a model may have produced it: "help" in two pieces, where the text encodes it as
    # one token. Re-encoding the text would give other ids; the splice must not.
    cut = REPLY.index("help") + 2
    ids = tokenizer.encode(REPLY[:cut], add_special_tokens=False)
    ids += tokenizer.encode(REPLY[cut:], add_special_tokens=False)
    assert tokenizer.decode(ids) == REPLY
    assert ids != tokenizer.encode(REPLY, add_special_tokens=False)
    return ids


def _contains(haystack: list[int], needle: list[int]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


@pytest.mark.django_db
def test_remembered_ids_are_spliced_for_their_tenant_only(tokenizer, django_user_model):
    from chatapp.api.models import ApiKey

    ann = django_user_model.objects.create_user("ann")
    ben = django_user_model.objects.create_user("ben")
    ann_key = services.api_key_create(user=ann)[0]
    ben_key = services.api_key_create(user=ben)[0]
    generated = _generated_ids(tokenizer)
    services.replies_remember(tenant=completions.tenant_of(ann_key), replies=[(REPLY, generated)])

    def prompt(key: ApiKey) -> list[int]:
        return completions.prepare(key=key, req=_request(), tokenizer=tokenizer).token_ids

    assert _contains(prompt(ann_key), generated)
    assert not _contains(prompt(ben_key), generated)  # ben's tenant never generated it

    # Bounded: once expired, the text is encoded afresh (and the row goes on the next write).
    RememberedReply.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert not _contains(prompt(ann_key), generated)
    services.replies_remember(tenant="other", replies=[("x", [1])])
    assert not RememberedReply.objects.filter(token_ids=generated).exists()


@pytest.mark.django_db
def test_cache_salt_is_scoped_to_the_tenant(django_user_model):
    ann = django_user_model.objects.create_user("ann")
    ben = django_user_model.objects.create_user("ben")
    ann_key = services.api_key_create(user=ann, allow_cache_salt=True)[0]
    ben_key = services.api_key_create(user=ben, allow_cache_salt=True)[0]
    plain = services.api_key_create(user=ann)[0]
    assert completions.request_salt(ann_key, None) == completions.tenant_of(ann_key)
    # The same client salt under two tenants still names two partitions.
    assert completions.request_salt(ann_key, "shared") != completions.request_salt(ben_key, "shared")
    assert completions.request_salt(ann_key, "shared") != completions.request_salt(ann_key, None)
    with pytest.raises(Exception) as info:
        completions.request_salt(plain, "shared")
    assert info.value.status == 400 and info.value.param == "cache_salt"
