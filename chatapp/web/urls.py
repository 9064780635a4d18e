from django.urls import path

from chatapp.web import shares, views

app_name = "chat"

urlpatterns = [
    path("", views.home, name="home"),
    path("c/new/", views.conversation_new, name="new"),
    path("c/list/", views.conversation_list, name="list"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("c/<int:conversation_id>/", views.conversation_page, name="conversation"),
    path("s/<str:token>/", shares.shared_conversation, name="shared"),
    path("c/<int:conversation_id>/messages.json", views.conversation_messages, name="messages"),
    path("c/<int:conversation_id>/rename/", views.conversation_rename, name="rename"),
    path("c/<int:conversation_id>/delete/", views.conversation_delete, name="delete"),
]
