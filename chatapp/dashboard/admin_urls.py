"""/admin/cache/...: staff-only pages inside the admin (admin_view redirects others to its login)."""

from django.contrib import admin
from django.urls import path

from chatapp.dashboard import feedback_export, views

app_name = "dashboard"

urlpatterns = [
    path("", admin.site.admin_view(views.dashboard), name="cache"),
    path("data/", admin.site.admin_view(views.dashboard_data), name="cache-data"),
    path("feedback.csv", admin.site.admin_view(feedback_export.feedback_csv),
         name="feedback-csv"),
    path("reset/<str:engine_id>/", admin.site.admin_view(views.reset_cache), name="cache-reset"),
]
