import pytest


@pytest.fixture(autouse=True)
def small_replies(settings):
    """Short, greedy replies keep the suite fast on two CPU cores."""
    settings.CHAT_MAX_NEW_TOKENS = 12
    settings.CHAT_TEMPERATURE = 0.0
    settings.CHAT_STREAM_BATCH_TOKENS = 4
