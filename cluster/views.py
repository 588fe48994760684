"""Server-rendered inventory page: nodes and GPUs per datacenter and chip type, by state."""

from __future__ import annotations

from django.db.models import Count, Q, Sum
from django.shortcuts import render

from cluster.choices import COLOURS, NodeState
from cluster.models import GPU, Datacenter, Node
from cluster.pages import viewer_page

_DC = "rack__pod__datacenter__name"
_REGION = "rack__pod__datacenter__region__name"


@viewer_page
def inventory(request):
    state_counts = {s: Count("id", filter=Q(state=s)) for s in NodeState.values}
    rows = (
        Node.objects.values(_REGION, _DC, "chip_type__name")
        .annotate(
            nodes=Count("id"),
            gpus=Sum("gpus_per_node"),
            spares=Count("id", filter=Q(is_spare=True)),
            **state_counts,
        )
        .order_by(_REGION, _DC, "chip_type__name")
    )
    table = [
        {
            "region": row[_REGION],
            "datacenter": row[_DC],
            "chip": row["chip_type__name"],
            "nodes": row["nodes"],
            "gpus": row["gpus"],
            "spares": row["spares"],
            "states": [(s, label, row[s], COLOURS[s]) for s, label in NodeState.choices],
        }
        for row in rows
    ]
    totals = {
        "gpus": GPU.objects.count(),
        "nodes": Node.objects.count(),
        "datacenters": Datacenter.objects.count(),
        "out_of_service": Node.objects.exclude(state=NodeState.READY).count(),
    }
    return render(
        request, "cluster/inventory.html", {"table": table, "totals": totals, "states": NodeState.choices}
    )
