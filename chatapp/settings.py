"""Settings from environment variables with safe defaults (SQLite, in-memory channel layer)."""

import os
import socket
from pathlib import Path

import dj_database_url
from django.core.management.utils import get_random_secret_key

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in ("1", "true", "yes", "on")


DEBUG = env_bool("DJANGO_DEBUG")


def _local_secret_key(path: Path) -> str:
    """A key kept on disk, so sessions and tenants' cache salts survive restarts and
    are the same in every process of this installation (web, workers, tests)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        key = get_random_secret_key()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process got there first
            return path.read_text().strip()
        with os.fdopen(fd, "w") as f:
            f.write(key)
        return key
    except OSError:
        return get_random_secret_key()


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or _local_secret_key(
    Path(os.environ.get("DJANGO_SECRET_KEY_FILE", BASE_DIR / ".secret_key"))
)
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
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "chatapp.api",
    "chatapp.dashboard",
    "chatapp.accounting",
    "django_celery_results",
]

MIDDLEWARE = [
    # First, so the web request metrics time the whole response.
    "chatapp.dashboard.middleware.RequestMetricsMiddleware",
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
                "chatapp.web.context_processors.chat",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}", conn_max_age=0
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Many sockets write at once under ASGI. A deferred transaction that reads and then
    # writes fails at once with "database is locked" when another connection writes;
    # IMMEDIATE takes the write lock up front and waits (timeout) instead, and WAL lets
    # readers go on meanwhile.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        transaction_mode="IMMEDIATE",
        timeout=30,
        init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
# Messages a channel holds before group_send drops more, silently. channels_redis keeps
# all of a process's sockets in one Redis key and counts them together: at its default
# of 100, thirty pages streaming at once on a busy host lost deltas and message.done.
CHANNEL_CAPACITY = int(os.environ.get("CHANNEL_CAPACITY", "10000"))
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "chatapp.channel_layer.RedisChannelLayer",
            # redis-py 8 times reads out after 5 s by default, exactly channels_redis's
            # BZPOPMIN wait: an idle socket's consumer would die. Allow well over 5 s.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                       "capacity": CHANNEL_CAPACITY},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer",
                                  "CONFIG": {"capacity": CHANNEL_CAPACITY}}}

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "chatapp" / "static"]

TIME_ZONE = "UTC"
USE_TZ = True

# Engine: the embedded LLM engine's settings (see inference.config.EngineConfig).
LLM_MODEL = os.environ.get("LLM_MODEL", "smollm2-135m-instruct")
LLM_DEVICE = os.environ.get("LLM_DEVICE", "cpu")
LLM_DTYPE = os.environ.get("LLM_DTYPE", "auto")
LLM_BLOCK_SIZE = int(os.environ.get("LLM_BLOCK_SIZE", "16"))
LLM_MODEL_CACHE = os.environ.get("PREFIXCHAT_MODEL_CACHE") or None
# How this process's engine is named on the dashboard and in /metrics; give each server
# process on one host its own (e.g. web-1, web-2).
LLM_ENGINE_ID = os.environ.get("LLM_ENGINE_ID") or f"web@{socket.gethostname()}"
# Engine sizing; unset lets the engine choose (see EngineConfig).
LLM_NUM_BLOCKS = int(os.environ.get("LLM_NUM_BLOCKS", "0")) or None
LLM_MAX_NUM_SEQS = int(os.environ.get("LLM_MAX_NUM_SEQS", "0")) or None
LLM_MAX_MODEL_LEN = int(os.environ.get("LLM_MAX_MODEL_LEN", "0")) or None
# Weights: bf16 (the compute dtype), int8 or int4 (quantized once, kept beside the model).
LLM_WEIGHT_DTYPE = os.environ.get("LLM_WEIGHT_DTYPE") or None
# The KV cache's dtype (unset: auto, bf16 under fp32 activations with compact weights).
LLM_KV_DTYPE = os.environ.get("LLM_KV_DTYPE") or None
# On CPU, matmul weights laid out once for oneDNN; quantized ones then keep a bf16 copy
# for prefill (their bf16 size in memory): 0 saves that memory at prefill's speed.
LLM_PACK_WEIGHTS = env_bool("LLM_PACK_WEIGHTS", True)
# KV blocks evicted from the pool are kept in host memory up to this many bytes, and
# under LLM_KV_DIR on disk (so a restart keeps them); unset: the engine's defaults.
LLM_KV_OFFLOAD_BYTES = int(os.environ.get("LLM_KV_OFFLOAD_BYTES", "0")) or None
LLM_KV_DIR = os.environ.get("LLM_KV_DIR") or None
# The KV pool's memory budget in bytes (unset: the engine's default); LLM_NUM_BLOCKS wins.
LLM_KV_CACHE_BYTES = int(os.environ.get("LLM_KV_CACHE_BYTES", "0")) or None
# Several models at once: "alias=model[:weight_dtype],..." (chatapp/generation/served_models.py),
# the first the default. Each gets its own engine; the process's KV budgets above
# (LLM_NUM_BLOCKS or LLM_KV_CACHE_BYTES, LLM_KV_OFFLOAD_BYTES) are split evenly between them.
# Unset: LLM_MODEL alone.
LLM_MODELS = os.environ.get("LLM_MODELS", "").strip()
# Models served as chat models though their file has no chat template (base models are
# completion models otherwise: chatapp/generation/model_cards.py): aliases or model
# names, comma-separated, or "*" for all. Their turns follow the chat format their
# tokenizer's special tokens match (templates/prompts/formats).
LLM_FORCE_CHAT_TEMPLATE = [m.strip() for m in os.environ.get("LLM_FORCE_CHAT_TEMPLATE", "").split(",")
                           if m.strip()]

# Chat service.
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "chat:home"
LOGOUT_REDIRECT_URL = "login"
CHAT_ALLOW_SIGNUP = env_bool("CHAT_ALLOW_SIGNUP", True)
# A shared conversation's link works for anyone who has it, unless this asks for a login.
CHAT_SHARE_REQUIRES_LOGIN = env_bool("CHAT_SHARE_REQUIRES_LOGIN")
# An imported export file (ChatGPT, Open WebUI): at most this many bytes and messages,
# refused whole beyond them.
CHAT_IMPORT_MAX_BYTES = int(os.environ.get("CHAT_IMPORT_MAX_BYTES", str(20 * 1024 * 1024)))
CHAT_IMPORT_MAX_MESSAGES = int(os.environ.get("CHAT_IMPORT_MAX_MESSAGES", "5000"))
# Opening a conversation brings its KV blocks back from the host/disk tier (LLM_KV_DIR,
# LLM_KV_OFFLOAD_BYTES), at most this many blocks, ahead of its next message.
CHAT_PREWARM = env_bool("CHAT_PREWARM", True)
CHAT_PREWARM_MAX_BLOCKS = int(os.environ.get("CHAT_PREWARM_MAX_BLOCKS", "512"))
# Static files are served by the ASGI app itself, so `make run` is complete without a proxy.
SERVE_STATIC = env_bool("SERVE_STATIC", True)
# Start loading the model when the ASGI app is imported, not on the first message.
LLM_PRELOAD = env_bool("LLM_PRELOAD", True)
CHAT_MAX_NEW_TOKENS = int(os.environ.get("CHAT_MAX_NEW_TOKENS", "512"))
CHAT_TEMPERATURE = float(os.environ.get("CHAT_TEMPERATURE", "0.7"))
CHAT_TOP_P = float(os.environ.get("CHAT_TOP_P", "0.9"))
# A chat's own system prompt (settings panel, personal presets): at most this many
# characters. CHAT_LOCK_PRESETS=1 lets users choose only the operator's presets.
CHAT_SYSTEM_PROMPT_MAX_CHARS = int(os.environ.get("CHAT_SYSTEM_PROMPT_MAX_CHARS", "8000"))
CHAT_LOCK_PRESETS = env_bool("CHAT_LOCK_PRESETS", False)
# History longer than the context: the oldest whole turns are left out, in one step down
# to this share of the context (chatapp.prompts.history). CHAT_CONTEXT_TOKENS (0: the
# model's context) keeps a chat's prompt and reply within fewer tokens than the model has.
CHAT_HISTORY_TARGET = float(os.environ.get("CHAT_HISTORY_TARGET", "0.5"))
CHAT_CONTEXT_TOKENS = int(os.environ.get("CHAT_CONTEXT_TOKENS", "0"))
# At a cut, ask the model once for a summary of the turns left out; later prompts of
# that cut show it after the marker, in at most CHAT_HISTORY_SUMMARY_TOKENS (whole blocks).
CHAT_HISTORY_SUMMARY = env_bool("CHAT_HISTORY_SUMMARY", False)
CHAT_HISTORY_SUMMARY_TOKENS = int(os.environ.get("CHAT_HISTORY_SUMMARY_TOKENS", "256"))
# After a conversation's first reply the model writes its title, from the cached prompt,
# when the engine is idle or on a worker; a user's rename wins.
CHAT_TITLES = env_bool("CHAT_TITLES", True)
# A streamed reply goes out in batches of this many tokens (or after CHAT_STREAM_FLUSH_S).
CHAT_STREAM_BATCH_TOKENS = int(os.environ.get("CHAT_STREAM_BATCH_TOKENS", "4"))
CHAT_STREAM_FLUSH_S = float(os.environ.get("CHAT_STREAM_FLUSH_S", "0.1"))
# A running reply is persisted (its text, ids and usage so far) every CHAT_HEARTBEAT_S:
# at most that much is lost when its process dies. One claimed by a process but untouched
# for CHAT_ORPHAN_S has lost it and is finished as interrupted; one queued for a worker
# and never claimed gets CHAT_STALE_REPLY_S.
CHAT_HEARTBEAT_S = float(os.environ.get("CHAT_HEARTBEAT_S", "1"))
CHAT_ORPHAN_S = float(os.environ.get("CHAT_ORPHAN_S", "10"))
# Every serving process looks for orphans at start-up and then this often (0: never; a
# send or an opened conversation still does).
CHAT_ORPHAN_SWEEP_S = float(os.environ.get("CHAT_ORPHAN_SWEEP_S", str(CHAT_ORPHAN_S / 2)))
CHAT_STALE_REPLY_S = float(os.environ.get("CHAT_STALE_REPLY_S", "120"))

# Replies stopped in a worker: the generation reads its stop flag this often (seconds).
CHAT_STOP_POLL_S = float(os.environ.get("CHAT_STOP_POLL_S", "0.5"))

# Celery workers (chatapp/celery.py, chatapp/generation/). No broker: every reply runs on
# the web process's embedded engine. With a broker, the rule in
# chatapp.generation.dispatch sends some replies to workers, which host their own engine.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or REDIS_URL
CELERY_RESULT_BACKEND = "django-db"
# Imported when a worker starts (chatapp.generation is a package, not an installed app).
CELERY_IMPORTS = ["chatapp.generation.tasks", "chatapp.startup"]
# A worker that dies mid-reply must not lose the task: acknowledge only at the end, and
# requeue when the pool child is killed (acks_late alone would acknowledge it then).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# A generation is long: a worker holds only the task it runs, the rest stay queued for others.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = int(os.environ.get("CELERY_TASK_SOFT_TIME_LIMIT", "900"))
CELERY_TASK_TIME_LIMIT = int(
    os.environ.get("CELERY_TASK_TIME_LIMIT", str(CELERY_TASK_SOFT_TIME_LIMIT + 60))
)
# Seconds before the broker hands a task whose worker vanished to another worker. Keep it
# above the longest generation (a longer task would be handed out twice: the reply's lease
# keeps the second copy from generating, but it waits).
CELERY_VISIBILITY_TIMEOUT = int(os.environ.get("CELERY_VISIBILITY_TIMEOUT", "3600"))
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": CELERY_VISIBILITY_TIMEOUT,
    # Look for timed-out tasks a few times per timeout (kombu's default looks every 100 s).
    "unacked_restore_interval": max(1, min(60, CELERY_VISIBILITY_TIMEOUT // 4)),
    "unacked_restore_throttle": 1,
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# When the broker is down a user waits about a second for the refusal, not minutes.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5,
}
# Every worker consumes this queue besides its own (named after its hostname).
CELERY_SHARED_QUEUE = os.environ.get("CELERY_SHARED_QUEUE", "generation")
CELERY_TASK_DEFAULT_QUEUE = CELERY_SHARED_QUEUE
# The rule (0 turns a part off): a chat reply allowed at least CELERY_REPLY_MIN_TOKENS new
# tokens goes to a worker; so does any reply while the embedded engine already has
# CELERY_EMBEDDED_MAX_WAITING requests waiting.
CELERY_REPLY_MIN_TOKENS = int(os.environ.get("CELERY_REPLY_MIN_TOKENS", "0"))
CELERY_EMBEDDED_MAX_WAITING = int(os.environ.get("CELERY_EMBEDDED_MAX_WAITING", "0"))
# A conversation stays on the worker that holds its blocks unless that worker has more
# than this many tasks queued; then the least-loaded live worker takes the turn.
CELERY_AFFINITY_MAX_QUEUE = int(os.environ.get("CELERY_AFFINITY_MAX_QUEUE", "2"))
# Workers announce themselves in Redis this often; one silent for 3 beats counts as gone.
CELERY_WORKER_HEARTBEAT_S = float(os.environ.get("CELERY_WORKER_HEARTBEAT_S", "10"))

# Prompt manager.
PROMPT_TEMPLATES_DIR = BASE_DIR / "templates" / "prompts"
MAX_USER_MESSAGE_CHARS = int(os.environ.get("MAX_USER_MESSAGE_CHARS", "16000"))

# REST API (chatapp/api): /v1/ (OpenAI-compatible) and /api/ (conversations).
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "chatapp.api.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["chatapp.api.throttling.ApiKeyRateThrottle"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 20,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "chatapp.api.errors.api_exception_handler",
    # JSON only, through the one bounded decoder (depth, size); other types answer 415.
    "DEFAULT_PARSER_CLASSES": ["chatapp.api.json_body.JSONParser"],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "PrefixChat API",
    "DESCRIPTION": "Conversations with cache-stable, token-level history. "
    "The OpenAI-compatible endpoints live under /v1/.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/",
    "COMPONENT_SPLIT_REQUEST": True,
    # The docs page loads Swagger UI from our own static files, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
# Untrusted JSON (HTTP bodies and WebSocket frames, chatapp/api/json_body.py): the largest
# document and the deepest nesting of arrays/objects accepted. Django's own limit on
# request.body follows the first, so /v1 and /api/ refuse at the same size.
REQUEST_JSON_MAX_BYTES = int(os.environ.get("REQUEST_JSON_MAX_BYTES", str(2_621_440)))
REQUEST_JSON_MAX_DEPTH = int(os.environ.get("REQUEST_JSON_MAX_DEPTH", "32"))
DATA_UPLOAD_MAX_MEMORY_SIZE = REQUEST_JSON_MAX_BYTES
# Seconds a request's whole body may take to arrive once the request has begun (408
# after that; chatapp/body_timeout.py); 0 turns the bound off.
REQUEST_BODY_TIMEOUT_S = float(os.environ.get("REQUEST_BODY_TIMEOUT_S", "30"))
# Per API key (a key may override both): requests per minute, generations at once.
API_RATE_LIMIT_RPM = int(os.environ.get("API_RATE_LIMIT_RPM", "120"))
API_MAX_CONCURRENT = int(os.environ.get("API_MAX_CONCURRENT", "4"))
# Limits shared by every process, in Redis (chatapp/accounting); docs/configuration.md.
LIMITS_REDIS_URL = os.environ.get("LIMITS_REDIS_URL", REDIS_URL)
LIMITS_REDIS_PREFIX = os.environ.get("LIMITS_REDIS_PREFIX", "limits")
LIMITS_REDIS_TIMEOUT_S = float(os.environ.get("LIMITS_REDIS_TIMEOUT_S", "0.5"))
LIMITS_SLOT_TTL_S = float(os.environ.get("LIMITS_SLOT_TTL_S", "60"))
LIMITS_USER_RPM = int(os.environ.get("LIMITS_USER_RPM", "0"))
LIMITS_USER_CONCURRENT = int(os.environ.get("LIMITS_USER_CONCURRENT", "0"))
LIMITS_USER_TOKENS_PER_DAY = int(os.environ.get("LIMITS_USER_TOKENS_PER_DAY", "0"))
LIMITS_USER_TOKENS_PER_MONTH = int(os.environ.get("LIMITS_USER_TOKENS_PER_MONTH", "0"))
LIMITS_KEY_TOKENS_PER_DAY = int(os.environ.get("LIMITS_KEY_TOKENS_PER_DAY", "0"))
LIMITS_KEY_TOKENS_PER_MONTH = int(os.environ.get("LIMITS_KEY_TOKENS_PER_MONTH", "0"))
CHAT_CACHED_TOKEN_WEIGHT = float(os.environ.get("CHAT_CACHED_TOKEN_WEIGHT", "0.25"))
# How long the ids generated for an API reply are remembered for splicing back (seconds).
API_REMEMBER_IDS_TTL_S = int(os.environ.get("API_REMEMBER_IDS_TTL_S", "86400"))
API_MAX_N = int(os.environ.get("API_MAX_N", "8"))
# The most completions one /v1/completions request makes: prompts in its batch times n.
API_MAX_PROMPTS = int(os.environ.get("API_MAX_PROMPTS", "64"))
# The most messages one /v1 request may carry (OpenAI's bound): a body of many tiny
# messages costs the prompt builder far more than its size suggests.
API_MAX_MESSAGES = int(os.environ.get("API_MAX_MESSAGES", "2048"))
API_DEFAULT_MAX_TOKENS = int(os.environ.get("API_DEFAULT_MAX_TOKENS", "512"))
# Names /v1/models lists and /v1/chat/completions accepts for the default model, besides
# its own (LLM_MODEL, or the first alias of LLM_MODELS).
API_MODEL_ALIASES = [a for a in os.environ.get("API_MODEL_ALIASES", "").split(",") if a.strip()]

# Cache dashboard (chatapp/dashboard): /admin/cache/, /metrics, /healthz, /readyz.
# Seconds between history samples of this process's engine; 0 turns the sampler off.
DASHBOARD_SAMPLE_INTERVAL_S = float(os.environ.get("DASHBOARD_SAMPLE_INTERVAL_S", "10"))
DASHBOARD_RETENTION_HOURS = float(os.environ.get("DASHBOARD_RETENTION_HOURS", "48"))
# "Hit rate over the last N requests" on the dashboard.
DASHBOARD_RECENT_REQUESTS = int(os.environ.get("DASHBOARD_RECENT_REQUESTS", "50"))
# An engine that has not reported for this long is shown as stale and left out of totals.
DASHBOARD_ENGINE_STALE_S = float(os.environ.get("DASHBOARD_ENGINE_STALE_S", "300"))
# When set, /metrics wants "Authorization: Bearer <token>".
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}
