"""/api/: conversations (DRF), its OpenAPI schema and docs page; /keys/: the key page."""

from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from chatapp.api import (
    chat_settings_views,
    feedback_views,
    import_views,
    schema,  # noqa: F401  (registers the Bearer scheme with drf-spectacular)
    share_views,
    views,
    web,
)

app_name = "api"

# Under api/conversations/<id>/.
conversation_urls = [
    path("", views.ConversationDetailView.as_view(), name="conversation"),
    path("messages/", views.MessageListView.as_view(), name="messages"),
    path("messages/<int:message_id>/", views.MessageDetailView.as_view(), name="message"),
    path("messages/<int:message_id>/stop/", views.MessageStopView.as_view(), name="message-stop"),
    path("messages/<int:message_id>/continue/", views.MessageContinueView.as_view(),
         name="message-continue"),
    path("settings/", chat_settings_views.ConversationSettingsView.as_view(), name="settings"),
    path("messages/<int:message_id>/feedback/", feedback_views.FeedbackView.as_view(),
         name="message-feedback"),
    path("shares/", share_views.ShareListView.as_view(), name="shares"),
    path("shares/<int:share_id>/", share_views.ShareDetailView.as_view(), name="share"),
    path("export/", views.ExportView.as_view(), name="export"),
    path("export/markdown/", views.ExportMarkdownView.as_view(), name="export-markdown"),
]

urlpatterns = [
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("api/presets/", views.PresetListView.as_view(), name="presets"),
    path("api/user-presets/", chat_settings_views.UserPresetListView.as_view(),
         name="user-presets"),
    path("api/user-presets/<int:preset_id>/", chat_settings_views.UserPresetDetailView.as_view(),
         name="user-preset"),
    path("api/conversations/", views.ConversationListView.as_view(), name="conversations"),
    path("api/conversations/import/", import_views.ConversationImportView.as_view(),
         name="conversations-import"),
    path("api/conversations/<int:conversation_id>/", include(conversation_urls)),
    # Anything else under /api/ answers a JSON 404 (not the HTML page) in the API's shape.
    re_path(r"^api/", views.not_found),
    path("keys/", web.keys_page, name="keys"),
    path("keys/<int:key_id>/revoke/", web.key_revoke, name="key-revoke"),
]
