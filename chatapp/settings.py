"""Settings from environment variables with safe defaults (SQLite, in-memory channel layer)."""

import os
from pathlib import Path

import dj_database_url
from django.core.management.utils import get_random_secret_key

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in ("1", "true", "yes", "on")


DEBUG = env_bool("DJANGO_DEBUG")
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or get_random_secret_key()
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "chatapp.prompts",
    "chatapp.chat",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "chatapp.urls"
ASGI_APPLICATION = "chatapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "chatapp.chat.context_processors.chat",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}", conn_max_age=0
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "chatapp" / "static"]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Engine: the embedded LLM engine's settings (see inference.config.EngineConfig).
LLM_MODEL = os.environ.get("LLM_MODEL", "smollm2-135m-instruct")
LLM_DEVICE = os.environ.get("LLM_DEVICE", "cpu")
LLM_DTYPE = os.environ.get("LLM_DTYPE", "auto")
LLM_BLOCK_SIZE = int(os.environ.get("LLM_BLOCK_SIZE", "16"))
LLM_MODEL_CACHE = os.environ.get("PREFIXCHAT_MODEL_CACHE") or None

# Chat service.
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "chat:home"
LOGOUT_REDIRECT_URL = "login"
CHAT_ALLOW_SIGNUP = env_bool("CHAT_ALLOW_SIGNUP", True)
# Static files are served by the ASGI app itself, so `make run` is complete without a proxy.
SERVE_STATIC = env_bool("SERVE_STATIC", True)
# Start loading the model when the ASGI app is imported, not on the first message.
LLM_PRELOAD = env_bool("LLM_PRELOAD", True)
CHAT_MAX_NEW_TOKENS = int(os.environ.get("CHAT_MAX_NEW_TOKENS", "512"))
CHAT_TEMPERATURE = float(os.environ.get("CHAT_TEMPERATURE", "0.7"))
CHAT_TOP_P = float(os.environ.get("CHAT_TOP_P", "0.9"))
# A streamed reply goes out in batches of this many tokens (or after CHAT_STREAM_FLUSH_S).
CHAT_STREAM_BATCH_TOKENS = int(os.environ.get("CHAT_STREAM_BATCH_TOKENS", "4"))
CHAT_STREAM_FLUSH_S = float(os.environ.get("CHAT_STREAM_FLUSH_S", "0.1"))

# Prompt manager.
PROMPT_TEMPLATES_DIR = BASE_DIR / "templates" / "prompts"
MAX_USER_MESSAGE_CHARS = int(os.environ.get("MAX_USER_MESSAGE_CHARS", "16000"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}
