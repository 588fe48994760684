"""Stored what-if simulations: run one from its record (the Celery task) and find its report."""

from __future__ import annotations

import time
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from engine.presets import PRESETS, preset_document
from monitoring.models import Simulation
from monitoring.simreport import parse_config, run_all, write_report


def report_path(simulation: Simulation) -> Path:
    return Path(settings.DATA_DIR) / "simulations" / str(simulation.pk) / "report.html"


def inventory_document() -> dict:
    """The live inventory as a topology document (so a what-if runs on the cluster as built)."""
    from cluster.models import DatacenterLink, Pod

    regions: dict = {}
    pods = Pod.objects.select_related("datacenter__region").prefetch_related("racks__nodes__chip_type")
    for pod in pods:
        racks = list(pod.racks.all())
        nodes = [n for r in racks for n in r.nodes.all()]
        if not racks or not nodes:
            continue
        region = regions.setdefault(pod.datacenter.region.name, {})
        dc = region.setdefault(pod.datacenter.name, [])
        dc.append(
            {
                "name": pod.name,
                "chip_type": nodes[0].chip_type.name,
                "racks": len(racks),
                "nodes_per_rack": max(1, len(nodes) // len(racks)),
                "gpus_per_node": nodes[0].gpus_per_node,
                "spare_nodes": sum(1 for n in nodes if n.is_spare),
            }
        )
    doc = {
        "regions": [
            {"name": r, "datacenters": [{"name": d, "pods": pods} for d, pods in dcs.items()]}
            for r, dcs in regions.items()
        ]
    }
    links = [
        {
            "between": [link.a.name, link.b.name],
            "distance_km": link.distance_km,
            "bandwidth_gbps": link.bandwidth_gbps,
        }
        for link in DatacenterLink.objects.select_related("a", "b")
    ]
    if links:
        doc["links"] = links
    return doc


def cluster_document(cluster: str) -> dict:
    if cluster in PRESETS:
        return preset_document(cluster)
    if cluster == "inventory":
        return inventory_document()
    raise ValueError(f"unknown cluster {cluster!r}; known: {', '.join(PRESETS)}, inventory")


def run_stored(simulation_id: int) -> str:
    sim = Simulation.objects.get(pk=simulation_id)
    Simulation.objects.filter(pk=sim.pk).update(state=Simulation.State.RUNNING, started_at=timezone.now())
    configs = [parse_config(c) for c in (sim.configurations or ["baseline"])]
    last = [0.0]

    def progress(name: str, fraction: float) -> None:
        index = [c["name"] for c in configs].index(name)
        overall = (index + fraction) / len(configs)
        if time.monotonic() - last[0] >= 1.0 or fraction >= 1:
            last[0] = time.monotonic()
            Simulation.objects.filter(pk=sim.pk).update(progress=min(1.0, overall))

    try:
        results = run_all(
            cluster_document(sim.cluster),
            configs,
            days=sim.days,
            seed=sim.seed,
            jobs=sim.jobs,
            elastic_share=sim.elastic_share,
            progress=progress,
        )
        path = report_path(sim)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_report(results, path)
    except Exception as exc:  # noqa: BLE001 - the record says what went wrong; the worker carries on
        Simulation.objects.filter(pk=sim.pk).update(
            state=Simulation.State.FAILED, error=f"{type(exc).__name__}: {exc}", finished_at=timezone.now()
        )
        return "failed"
    summary = [{k: v for k, v in r.items() if k != "series"} for r in results]
    Simulation.objects.filter(pk=sim.pk).update(
        state=Simulation.State.DONE,
        progress=1.0,
        summary={"results": summary},
        finished_at=timezone.now(),
    )
    return "done"
