from django.urls import path

from chatapp.accounting import views

app_name = "accounting"

urlpatterns = [
    path("usage/", views.my_usage, name="mine"),
    path("usage/all/", views.all_usage, name="all"),
    path("usage/all.csv", views.all_usage_csv, name="all-csv"),
]
