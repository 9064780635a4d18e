"""The chat page and its few form endpoints. Thin: services and selectors do the work."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import UserCreationForm
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.http import require_GET, require_POST

from chatapp.chat import chat_settings, feedback, selectors, services
from chatapp.chat.errors import ChatError, NotFound
from chatapp.chat.models import Conversation
from chatapp.chat.payloads import conversation_dict, message_dict
from chatapp.generation import model_cards, orphans, replies, served_models
from chatapp.prompts import catalog
from chatapp.web import settings_panel

USER_PRESET_PREFIX = "user:"


def _conversation_or_404(request: HttpRequest, conversation_id: int):
    try:
        return selectors.conversation_get(user=request.user, conversation_id=conversation_id)
    except NotFound:
        raise Http404("Conversation not found.") from None


def _error_page(request: HttpRequest, error: ChatError) -> HttpResponse:
    return render(request, "chat/error.html", {"error": error.message}, status=error.http_status)


def _tree(conversation) -> dict:
    """The conversation and its whole message tree, as the page's script reads them, with
    the owner's feedback on its replies (feedback.js)."""
    messages = orphans.as_read(selectors.conversation_messages(conversation=conversation),
                               conversation=conversation)
    return {"conversation": conversation_dict(conversation),
            "messages": [message_dict(m) for m in messages],
            "feedback": feedback.conversation_feedback(user=conversation.owner,
                                                       conversation=conversation)}


def _listing(request: HttpRequest) -> dict:
    """The sidebar's conversations, filtered by ?q= (titles and message text), ?tag= and
    ?archived=1 (the archived ones instead of the others); pinned ones first."""
    search, tag = request.GET.get("q", ""), request.GET.get("tag", "").strip()
    archived = True if request.GET.get("archived") else None
    found = selectors.sidebar_list(user=request.user, search=search, archived=archived, tag=tag)
    return {"conversations": found[:200], "search": search, "tag": tag,
            "archived": bool(archived), "tags": selectors.user_tags(user=request.user)}


def _page(request: HttpRequest, conversation=None) -> HttpResponse:
    context = {
        **_listing(request),
        "presets": catalog.available_presets(),
        # The picker shows the open conversation's preset (New chat then makes another like it).
        "selected_preset": conversation.preset_id if conversation else catalog.default_preset_id(),
        "conversation": conversation,
        # The model picker (shown when several models are served), like the preset's.
        "models": model_cards.chat_aliases(),
        "selected_model": served_models.alias_of(conversation.model if conversation else ""),
        "max_chars": settings.MAX_USER_MESSAGE_CHARS,
        "title_max_chars": Conversation.TITLE_MAX_CHARS,
    }
    context.update(settings_panel.page_context(request.user, conversation))
    if conversation is not None:
        context["initial"] = _tree(conversation)
    return render(request, "chat/chat.html", context)


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return _page(request)


@login_required
@require_GET
def conversation_page(request: HttpRequest, conversation_id: int) -> HttpResponse:
    return _page(request, _conversation_or_404(request, conversation_id))


@login_required
@require_GET
def conversation_list(request: HttpRequest) -> HttpResponse:
    """The sidebar's list alone: the page swaps it in as the user types a search."""
    return render(request, "chat/_conversation_list.html", _listing(request))


@login_required
@require_GET
def conversation_messages(request: HttpRequest, conversation_id: int) -> JsonResponse:
    """The whole message tree: the page reloads it when it missed stream events."""
    return JsonResponse(_tree(_conversation_or_404(request, conversation_id)))


@login_required
@require_POST
def conversation_new(request: HttpRequest) -> HttpResponse:
    preset_id = request.POST.get("preset_id") or None
    # "user:<id>" in the picker: one of the user's personal presets (its settings, model).
    own = preset_id.removeprefix(USER_PRESET_PREFIX) if preset_id and preset_id.startswith(
        USER_PRESET_PREFIX) else None
    try:
        conversation = chat_settings.conversation_start(
            owner=request.user, user_preset_id=own, preset_id=None if own else preset_id,
            model=model_cards.conversation_model(request.POST.get("model") or None),
        )
    except ChatError as exc:
        return _error_page(request, exc)
    return redirect("chat:conversation", conversation_id=conversation.pk)


@login_required
@require_POST
def conversation_rename(request: HttpRequest, conversation_id: int) -> HttpResponse:
    conversation = _conversation_or_404(request, conversation_id)
    try:
        services.conversation_rename(conversation=conversation, title=request.POST.get("title"))
    except ChatError as exc:
        return _error_page(request, exc)
    return redirect("chat:conversation", conversation_id=conversation.pk)


@login_required
@require_POST
def conversation_delete(request: HttpRequest, conversation_id: int) -> HttpResponse:
    replies.delete_conversation(conversation=_conversation_or_404(request, conversation_id))
    return redirect("chat:home")


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico on pages that link no icon (the admin's): no 404."""
    return redirect(static("chat/favicon.svg"), permanent=True)


def signup(request: HttpRequest) -> HttpResponse:
    if not settings.CHAT_ALLOW_SIGNUP:
        raise Http404("Sign-up is switched off on this server.")
    if request.user.is_authenticated:
        return redirect("chat:home")
    form = UserCreationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("chat:home")
    status = 400 if request.method == "POST" else 200
    return render(request, "registration/signup.html", {"form": form}, status=status)
