"""The shop's own tables: orders, and the shipments a workflow step creates."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    request_id = models.CharField(max_length=64, unique=True)
    item = models.CharField(max_length=100)
    quantity = models.PositiveIntegerField()


class Shipment(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE)
    label = models.CharField(max_length=200)
