"""The shop's views: placing an order starts its fulfilment run in the same transaction."""

from __future__ import annotations

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET, require_POST

from cyclone.contrib.django.models import Run
from shop.models import Order
from shop.workflows import OrderPlaced, fulfil


@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    with transaction.atomic():
        order, _ = Order.objects.get_or_create(
            request_id=request.POST["request_id"],
            defaults={"item": request.POST["item"], "quantity": int(request.POST["quantity"])},
        )
        placed = OrderPlaced(order_id=order.id, item=order.item, quantity=order.quantity)
        run, created = fulfil.submit_once_tx(connection, f"order:{order.id}", placed)
    return JsonResponse(
        {"order": order.id, "run": str(run.id), "created": created},
        status=201 if created else 200,
    )


@require_GET
def order_status(request: HttpRequest, order_id: int) -> JsonResponse:
    order = get_object_or_404(Order, pk=order_id)
    run = get_object_or_404(Run, workflow=fulfil.name, submit_key=f"order:{order.id}")
    return JsonResponse({"order": order.id, "run": str(run.id), "state": run.state})
