"""Several models in one service, without a live server: LLM_MODELS' syntax, each model's
engine settings and budget share, the conversation's model, and routing that sends a
turn only to a worker that hosts its model (or keeps it here)."""

from __future__ import annotations

import json

import pytest

from chatapp.chat import services
from chatapp.chat.errors import InvalidInput
from chatapp.chat.models import Conversation
from chatapp.generation import dispatch, registry, replies, router, served_models
from chatapp.generation.embedded import engine_config
from chatapp.generation.router import Candidate, choose_queue
from chatapp.generation.served_models import ModelSpec, UnknownModel, parse_models

from .test_routing import redis_registry  # noqa: F401 (a fixture)

TWO = "small=smollm2-135m-instruct,tiny=/models/tiny:int8"


class TestSyntax:
    def test_aliases_models_and_weight_dtypes(self):
        assert parse_models(" small = smollm2-135m-instruct , q=/srv/m.gguf:int4,") == [
            ModelSpec("small", "smollm2-135m-instruct"), ModelSpec("q", "/srv/m.gguf", "int4")]

    def test_a_colon_that_is_no_weight_dtype_stays_in_the_path(self):
        assert parse_models("a=/data/run:3/model") == [ModelSpec("a", "/data/run:3/model")]

    @pytest.mark.parametrize(("text", "says"), [
        ("smollm2-135m-instruct", "alias=model"),
        ("a=", "alias=model"),
        ("a b=m", "alias"),
        ("a=m,a=n", "twice"),
    ])
    def test_mistakes_are_named(self, text, says):
        with pytest.raises(ValueError, match=says):
            parse_models(text)

    def test_a_mistake_stops_a_serving_process_at_start(self, settings):
        from django.core.exceptions import ImproperlyConfigured

        from chatapp.startup import start_process

        settings.LLM_MODELS = "a=m,a=n"
        with pytest.raises(ImproperlyConfigured, match="twice"):
            start_process(preload=False)


class TestCatalog:
    def test_unset_the_one_model_is_llm_model(self, settings):
        settings.LLM_MODELS = ""
        settings.API_MODEL_ALIASES = ["gpt-4o-mini"]
        assert served_models.aliases() == [settings.LLM_MODEL]
        assert served_models.names_listed() == [settings.LLM_MODEL, "gpt-4o-mini"]
        assert served_models.resolve("gpt-4o-mini").alias == settings.LLM_MODEL
        # Its conversations store the blank default: changing LLM_MODEL keeps them answerable.
        assert served_models.conversation_value(settings.LLM_MODEL) == ""
        assert served_models.engine_id_for(settings.LLM_MODEL) == settings.LLM_ENGINE_ID

    def test_several_the_first_is_the_default(self, settings):
        settings.LLM_MODELS = TWO
        settings.API_MODEL_ALIASES = ["gpt-4o-mini"]
        assert served_models.names_listed() == ["small", "tiny", "gpt-4o-mini"]
        assert served_models.resolve("").alias == "small"
        assert served_models.resolve("gpt-4o-mini").alias == "small"
        assert served_models.conversation_value("tiny") == "tiny"
        assert served_models.engine_id_for("tiny") == f"{settings.LLM_ENGINE_ID}:tiny"
        with pytest.raises(UnknownModel, match="small, tiny"):
            served_models.resolve("gamma")
        with pytest.raises(InvalidInput, match="not served"):
            served_models.conversation_model("gamma")

    def test_each_model_gets_its_share_of_the_budget_and_its_own_tier(self, settings, tmp_path):
        settings.LLM_MODELS = TWO
        settings.LLM_NUM_BLOCKS = 1000
        settings.LLM_WEIGHT_DTYPE = "bf16"
        settings.LLM_KV_OFFLOAD_BYTES = 2 << 20
        settings.LLM_KV_DIR = str(tmp_path)
        small, tiny = engine_config("small"), engine_config("tiny")
        assert (small.num_blocks, tiny.num_blocks) == (500, 500)
        assert (small.kv_offload_bytes, tiny.kv_offload_bytes) == (1 << 20, 1 << 20)
        assert (small.weight_dtype, tiny.weight_dtype) == ("bf16", "int8")
        assert (small.model, tiny.model) == ("smollm2-135m-instruct", "/models/tiny")
        assert small.kv_dir != tiny.kv_dir and tiny.kv_dir.endswith("tiny")
        assert small.engine_id != tiny.engine_id

    def test_the_memory_budget_is_split_too(self, settings):
        from inference import EngineConfig

        settings.LLM_MODELS = TWO
        settings.LLM_NUM_BLOCKS = None
        settings.LLM_KV_CACHE_BYTES = None
        default = EngineConfig().kv_cache_memory_bytes
        assert engine_config("tiny").kv_cache_memory_bytes == default // 2
        settings.LLM_KV_CACHE_BYTES = 300 << 20
        assert engine_config("tiny").kv_cache_memory_bytes == 150 << 20
        settings.LLM_MODELS = ""
        assert engine_config().kv_cache_memory_bytes == 300 << 20


@pytest.mark.django_db
class TestConversationModel:
    def test_the_page_stores_the_picked_model(self, client, alice, settings):
        settings.LLM_MODELS = TWO
        client.force_login(alice)
        response = client.post("/c/new/", {"preset_id": "general", "model": "tiny"})
        assert response.status_code == 302, response.content
        assert Conversation.objects.get(owner=alice).model == "tiny"
        page = client.get(response["Location"]).content.decode()
        assert 'id="model-picker"' in page and 'value="tiny" selected' in page
        assert client.post("/c/new/", {"model": "gamma"}).status_code == 400

    def test_one_model_no_picker(self, client, alice, settings):
        settings.LLM_MODELS = ""
        client.force_login(alice)
        assert 'id="model-picker"' not in client.get("/").content.decode()

    def test_a_replys_model_is_its_conversations(self, alice, settings):
        settings.LLM_MODELS = TWO
        conversation = services.conversation_create(owner=alice, model="tiny")
        _, reply = services.message_send(conversation=conversation, content="Hi.")
        assert replies.reply_model(reply.pk) == "tiny"


def cand(name: str, models=None, queued: int = 0, active: int = 0) -> Candidate:
    return Candidate(name=name, queue=f"q.{name}", queued=queued, active=active,
                     models=tuple(models) if models is not None else None)


class TestRouting:
    def choose(self, preferred: str, *candidates: Candidate, model: str = "b",
               max_queue: int = 2) -> str | None:
        return choose_queue(preferred=preferred, candidates=list(candidates),
                            max_queue=max_queue, shared_queue="shared", model=model)

    def test_only_a_worker_that_hosts_the_model_gets_its_turns(self):
        # The conversation's last worker does not host b: the one that does takes it.
        assert self.choose("w1", cand("w1", ["a"]), cand("w2", ["a", "b"])) == "q.w2"
        # Not the shared queue: a worker without b consumes it too.
        assert self.choose("", cand("w1", ["a"]), cand("w2", ["b"])) == "q.w2"

    def test_a_saturated_host_still_beats_a_worker_without_the_model(self):
        assert self.choose("", cand("w1", ["a"]), cand("w2", ["b"], queued=9),
                           cand("w3", ["b"], queued=5)) == "q.w3"

    def test_no_live_host_means_here(self):
        assert self.choose("w1", cand("w1", ["a"]), cand("w2", ["a"])) is None

    def test_when_every_worker_hosts_it_the_old_rule_holds(self):
        assert self.choose("", cand("w1", ["a", "b"]), cand("w2", ["b"])) == "shared"
        assert self.choose("w1", cand("w1", ["b"]), cand("w2", ["b"])) == "q.w1"
        # A worker that does not advertise (from before several models) hosts anything.
        assert self.choose("", cand("old")) == "shared"
        assert self.choose("") == "shared"


class FakeRedis:
    """The two hash commands the registry's beat and listing use."""

    def __init__(self):
        self.hashes: dict[str, dict[bytes, bytes]] = {}

    def hset(self, key, field, value):
        self.hashes.setdefault(key, {})[field.encode()] = value.encode()

    def hgetall(self, key):
        return dict(self.hashes.get(key, {}))


def test_workers_advertise_their_models_in_the_heartbeat(monkeypatch, settings):
    fake = FakeRedis()
    monkeypatch.setattr(registry, "client", lambda: fake)
    registry.beat("w1@h", active=0, models=["a", "b"])
    registry.beat("w2@h", active=1)
    # A record from before several models has no "models": it hosts anything.
    states = {w.name: w.models for w in registry.workers()}
    assert states == {"w1@h": ("a", "b"), "w2@h": None}
    record = json.loads(next(iter(fake.hashes.values()))[b"w1@h"])
    assert record["models"] == ["a", "b"]


def test_the_worker_beat_names_every_model_it_serves(monkeypatch, settings):
    from chatapp.generation import worker

    settings.LLM_MODELS = TWO
    beats = []
    monkeypatch.setattr(worker, "_name", "w1@h")
    monkeypatch.setattr(registry, "beat", lambda name, **kw: beats.append((name, kw)))
    monkeypatch.setattr(registry, "sweep_dead", lambda: 0)
    worker._beat_once()
    assert beats == [("w1@h", {"active": 0, "ready": False, "models": ["small", "tiny"]})]


@pytest.mark.django_db
def test_a_reply_goes_only_to_a_worker_that_hosts_its_model(alice, monkeypatch, settings):
    from chatapp.celery import app

    settings.LLM_MODELS = TWO
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # a registry; nothing is sent
    settings.CELERY_REPLY_MIN_TOKENS = 1
    sent = []
    monkeypatch.setattr(app, "send_task", lambda *a, **kw: sent.append(kw["queue"]))
    workers = [cand("w1@h", ["small"]), cand("w2@h", ["small", "tiny"])]
    monkeypatch.setattr(router, "live_candidates", lambda: workers)

    conversation = services.conversation_create(owner=alice, model="tiny")
    _, reply = services.message_send(conversation=conversation, content="Hi.")
    assert replies.hand_off(reply) is True and sent == ["q.w2@h"]
    # No live worker hosts it: the reply runs on this process's engine of that model.
    workers[1] = cand("w2@h", ["small"])
    assert replies.hand_off(reply) is False and sent == ["q.w2@h"]
    assert dispatch.completion_queue(max_tokens=16, affinity="", model="tiny") is None
    assert dispatch.completion_queue(max_tokens=16, affinity="", model="small") == (
        settings.CELERY_SHARED_QUEUE)


def test_a_conversations_affinity_key_names_its_model():
    from types import SimpleNamespace

    plan = SimpleNamespace(segments=[], token_ids=[1, 2, 3])
    keys = {router.conversation_key(cache_salt="t", plan=plan, model=m) for m in ("a", "b")}
    assert len(keys) == 2


@pytest.mark.usefixtures("redis_registry")
def test_the_router_reads_advertised_models_from_redis(settings):
    settings.LLM_MODELS = TWO
    registry.beat("w1@h", active=0, models=["small"])
    registry.beat("w2@h", active=0, models=["small", "tiny"])
    assert {c.name: c.models for c in router.live_candidates()} == {
        "w1@h": ("small",), "w2@h": ("small", "tiny")}
    assert router.queue_for(preferred="w1@h", model="tiny") == registry.own_queue("w2@h")
    assert router.queue_for(preferred="w1@h", model="") == registry.own_queue("w1@h")


@pytest.mark.django_db
def test_a_new_conversation_prefers_a_worker_warm_for_its_model(alice, settings):
    from chatapp.chat.models import Message

    settings.LLM_MODELS = TWO
    served = services.conversation_create(owner=alice, model="tiny")
    _, old = services.message_send(conversation=served, content="Hi.")
    Message.objects.filter(pk=old.pk).update(served_by="w2@h", status=Message.Status.DONE)
    for model, warm in (("tiny", "w2@h"), ("small", "")):
        conversation = services.conversation_create(owner=alice, model=model)
        _, reply = services.message_send(conversation=conversation, content="Hi.")
        assert router.preferred_worker(reply) == warm
