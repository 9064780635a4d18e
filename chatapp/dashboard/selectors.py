"""What the dashboard shows, read from the live engine, the status table and the chat tables."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Avg, Count, F, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from chatapp.chat.models import Message
from chatapp.dashboard import charts, engines, history, stats
from chatapp.dashboard.models import EngineStatus
from chatapp.generation.receipts import shown_reason
from chatapp.prompts.profile import profile_prompts, recent_prompts
from chatapp.prompts.services import builder_for

log = logging.getLogger(__name__)

RECENT_ROWS = 20
PROFILE_PROMPTS = 8


@dataclass
class EngineReport:
    engine_id: str
    snapshot: dict
    reported_at: datetime
    live: bool  # this process's engine, read now rather than from its last sample
    stale: bool
    reset_pending: bool = False


def engine_reports(*, now: datetime | None = None) -> list[EngineReport]:
    """Every engine we know of: this process's live ones first (one per loaded model), then
    the others' last reports."""
    now = now or timezone.now()
    stale_after = timedelta(seconds=settings.DASHBOARD_ENGINE_STALE_S)
    reports = [EngineReport(local.get("engine_id", ""), local, now, True, False)
               for local in engines.local_snapshots()]
    live = {r.engine_id: r for r in reports}
    try:
        statuses = {s.engine_id: s for s in EngineStatus.objects.all()}
    except DatabaseError:
        # /metrics keeps exporting this process's engine while the database is away.
        log.warning("Engine reports unreadable; showing this process's engine only", exc_info=True)
        statuses = {}
    for engine_id, status in sorted(statuses.items()):
        if engine_id in live:
            live[engine_id].reset_pending = status.reset_pending
            continue
        reports.append(EngineReport(
            engine_id, status.snapshot, status.reported_at, False,
            now - status.reported_at > stale_after, status.reset_pending,
        ))
    return reports


def dashboard_figures(*, reports: list[EngineReport] | None = None) -> dict:
    """Per-engine figures, per-model totals (each model's engines, in every process) and
    the total of all (stale engines are shown, not added up)."""
    reports = engine_reports() if reports is None else reports
    n = settings.DASHBOARD_RECENT_REQUESTS
    rows = []
    for r in reports:
        figures = stats.engine_figures(r.snapshot, n)
        figures.update(live=r.live, stale=r.stale, reset_pending=r.reset_pending,
                       reported_at=r.reported_at.isoformat())
        rows.append(figures)
    counted = [r.snapshot for r in reports if not r.stale]
    total = stats.total_figures(counted, n)
    models = stats.model_figures(counted, n)
    return {"engines": rows, "models": models, "total": total, "recent_n": n}


# --- per preset ------------------------------------------------------------------------

def shared_prefix_lengths(keys) -> dict[tuple[str, str], int | None]:
    """The block-aligned system segment length of each (preset, version): from the prompts
    this process recorded, else rendered with the loaded engine's tokenizer."""
    found: dict[tuple[str, str], int | None] = {}
    for p in recent_prompts():
        if p.preset_id and p.shared_prefix_len is not None:
            found[(p.preset_id, p.preset_version or "")] = p.shared_prefix_len
    engine = engines.local_engine()
    for key in keys:
        if key in found:
            continue
        found[key] = None
        if engine is None:
            continue
        try:
            found[key] = len(builder_for(engine.tokenizer).system_segment(key[0], key[1] or None))
        except Exception:  # a preset removed since: the row stays, without a length
            log.debug("no system segment for %s", key, exc_info=True)
    return found


def preset_rows(*, since: datetime | None = None) -> list[dict]:
    """Per system prompt (preset and version): replies, tokens, hit rate, shared prefix."""
    qs = Message.objects.filter(role=Message.Role.ASSISTANT, prompt_tokens__isnull=False)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    rows = list(
        qs.values(preset_id=F("conversation__preset_id"),
                  preset_version=F("conversation__preset_version"))
        .annotate(
            requests=Count("id"),
            conversations=Count("conversation", distinct=True),
            prompt_tokens=Coalesce(Sum("prompt_tokens"), 0),
            cached_tokens=Coalesce(Sum("cached_tokens"), 0),
            completion_tokens=Coalesce(Sum("completion_tokens"), 0),
            ttft_avg=Avg("ttft"),
        )
        .order_by("preset_id", "preset_version")
    )
    shared = shared_prefix_lengths([(r["preset_id"], r["preset_version"]) for r in rows])
    for row in rows:
        row["hit_rate"] = stats.ratio(row["cached_tokens"], row["prompt_tokens"])
        row["shared_prefix_len"] = shared.get((row["preset_id"], row["preset_version"]))
    return rows


# --- recent requests ---------------------------------------------------------------------

def receipt_text(receipt: dict | None) -> str:
    """A receipt in a few words, as the chat page's usage line shows it."""
    if not receipt:
        return "no receipt"
    text = shown_reason(receipt.get("reason", "?"), receipt.get("matched_tokens") or 0)
    if text == "evicted" and receipt.get("evicted_from"):
        text += f" from {receipt['evicted_from']}"
    if text == "diverged":
        where = receipt.get("diverged_segment", "")
        if receipt.get("diverged_message_id"):
            where += f" #{receipt['diverged_message_id']}"
        text += f" at token {receipt.get('diverged_at')} ({where})"
    if receipt.get("tier_tokens"):
        text += f", {receipt['tier_tokens']} restored"
    return text


def _replies_by_request_id(request_ids: list[str]) -> dict[str, Message]:
    pks = [pk for rid in request_ids if (pk := Message.pk_from_request_id(rid)) is not None]
    replies = Message.objects.filter(pk__in=pks).select_related("conversation", "parent__parent")
    return {r.request_id: r for r in replies}


def recent_requests(*, reports: list[EngineReport], limit: int = RECENT_ROWS) -> list[dict]:
    """The latest finished requests of every engine, with why their match ended there: a
    chat reply's own receipt (it knows the previous turn), else the engine's."""
    items = [(r.engine_id, r.snapshot.get("block_size") or 0, req, r.snapshot.get("model") or "")
             for r in reports for req in list(r.snapshot.get("recent_requests") or [])[-limit:]]
    replies = _replies_by_request_id([req.get("request_id", "") for _, _, req, _ in items])
    rows = []
    for engine_id, bs, req, model in reversed(items):
        reply = replies.get(req.get("request_id", ""))
        cached = req.get("cached_tokens") or 0
        preset = None
        if reply is not None:
            conv = reply.conversation
            preset = f"{conv.preset_id}@{conv.preset_version}" if conv.preset_version else conv.preset_id
        rows.append({
            "engine_id": engine_id,
            "model": model,
            "request_id": req.get("request_id", ""),
            "preset": preset,
            "prompt_tokens": req.get("prompt_tokens") or 0,
            "cached_tokens": cached,
            "completion_tokens": req.get("completion_tokens"),
            "match_end_block": cached // bs if bs else None,
            "cause": receipt_text(reply.prefix_cache if reply is not None and reply.prefix_cache
                                  else req.get("prefix_cache")),
            "ttft": req.get("ttft"),
            "finish_reason": req.get("finish_reason"),
        })
    return rows[:limit]


# --- prompt profile ----------------------------------------------------------------------

def prompt_profile(*, limit: int = PROFILE_PROMPTS):
    """The prompt manager's profile of this process's recent prompts (None without a model)."""
    engine = engines.local_engine()
    prompts = recent_prompts(limit=limit)
    if engine is None or not prompts:
        return None
    return profile_prompts(prompts, tokenizer=engine.tokenizer, width=64,
                           block_size=settings.LLM_BLOCK_SIZE)


# --- the page ------------------------------------------------------------------------------

def page_data(*, range_name: str = "hour", now: datetime | None = None) -> dict:
    """Everything the dashboard shows and its JSON endpoint returns (JSON-safe)."""
    now = now or timezone.now()
    range_name = range_name if range_name in history.RANGES else "hour"
    reports = engine_reports(now=now)
    points = history.series(range_name=range_name, now=now)
    span = history.RANGES[range_name][0]
    return {
        "generated_at": now.isoformat(),
        "range": range_name,
        "figures": dashboard_figures(reports=reports),
        "presets": preset_rows(since=now - span),
        "recent_requests": recent_requests(reports=reports),
        "charts": charts.dashboard_charts(points),
    }
