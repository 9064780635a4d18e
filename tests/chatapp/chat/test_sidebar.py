"""The chat page's sidebar: pinned conversations first, archived ones out of the list
(shown by the Archived filter and by a search), the tag filter."""

import pytest
from django.urls import reverse

from chatapp.chat import services

pytestmark = pytest.mark.django_db


def titles(html: str, names) -> list[str]:
    """`names` in the order the sidebar's list shows them (absent ones left out)."""
    found = [(html.find(f">{n}<"), n) for n in names]
    return [n for at, n in sorted(found) if at >= 0]


def test_sidebar_orders_pins_first_and_filters(client, alice, bob):
    names = ["first", "second", "third", "fourth"]
    convs = {n: services.conversation_create(owner=alice, title=n) for n in names}
    services.conversation_organise(conversation=convs["first"], pinned=True, tags=["work"])
    services.conversation_organise(conversation=convs["third"], archived=True, tags=["work"])
    services.conversation_organise(conversation=services.conversation_create(
        owner=bob, title="bobs"), tags=["secret"])
    client.force_login(alice)

    page = client.get(reverse("chat:home")).content.decode()
    # Pinned first, then newest first; the archived one is gone.
    assert titles(page, names) == ["first", "fourth", "second"]
    assert 'value="work"' in page and "secret" not in page  # the tag filter's choices

    def listing(**params) -> list[str]:
        return titles(client.get(reverse("chat:list"), params).content.decode(), names)

    assert listing(archived="1") == ["third"]
    assert listing(q="thi") == ["third"]  # a search reaches archived ones
    assert listing(tag="work") == ["first"]
    assert listing(tag="work", archived="1") == ["third"]
    assert listing(tag="secret") == []
