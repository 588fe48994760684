from django.urls import path

from cluster import views

urlpatterns = [
    path("", views.inventory, name="inventory"),
]
