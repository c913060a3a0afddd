"""URLs of the test project: the admin and the shop's order views."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path
from shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders", views.create_order, name="create-order"),
    path("orders/<int:order_id>", views.order_status, name="order-status"),
]
