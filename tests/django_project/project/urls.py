"""URLs of the test project: the admin, cyclone's dashboard and the shop's order views."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("ops/cyclone/", include("cyclone.contrib.django.dashboard")),
    path("orders", views.create_order, name="create-order"),
    path("orders/<int:order_id>", views.order_status, name="order-status"),
]
