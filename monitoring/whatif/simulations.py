"""Stored what-if simulations: run one from its record (Celery tasks, one per configuration) and
find its report."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Avg
from django.utils import timezone

from cluster.models import DatacenterLink, Pod
from engine.presets import PRESETS, preset_document
from monitoring.models import Simulation, SimulationPart
from monitoring.signals import simulation_parts_wanted
from monitoring.whatif.simreport import parse_config, run_all, write_report


def report_path(simulation: Simulation) -> Path:
    return Path(settings.DATA_DIR) / "simulations" / str(simulation.pk) / "report.html"


def inventory_document() -> dict:
    """The live inventory as a topology document (so a what-if runs on the cluster as built)."""

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
            "latency_ms": link.latency_ms,
            "lanes": link.lanes - link.lanes_lost,  # a what-if runs on the links as they are now
            "lane_gbps": link.lane_gbps,
        }
        for link in DatacenterLink.objects.select_related("a", "b")
        if link.state != "down"
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


def start(simulation_id: int) -> str:
    """A stored simulation's task: one part per configuration. One configuration runs here; a
    sweep fans out as a Celery group, one task per configuration on the simulations workers, and
    the last part to finish assembles the report (``assemble``). This is a chord's work done under
    the simulation's row lock, so it needs no result backend and runs on the embedded broker too."""
    sim = Simulation.objects.get(pk=simulation_id)
    configs = sim.configurations or ["baseline"]
    try:
        for text in configs:
            parse_config(text)
    except ValueError as exc:
        _fail(sim.pk, f"configuration: {exc}")
        return "failed"
    Simulation.objects.filter(pk=sim.pk).update(state=Simulation.State.RUNNING, started_at=timezone.now())
    for index in range(len(configs)):
        SimulationPart.objects.get_or_create(simulation=sim, index=index)
    if len(configs) == 1:
        return run_part(sim.pk, 0)
    simulation_parts_wanted.send(sender=Simulation, simulation=sim.pk, indices=list(range(len(configs))))
    return f"{len(configs)} configurations started"


def run_part(simulation_id: int, index: int, worker: str = "") -> str:
    """Run one configuration of a simulation (on the workload every part shares) and keep its
    results; a task run again after its result was kept only assembles."""
    sim = Simulation.objects.get(pk=simulation_id)
    if sim.state == Simulation.State.FAILED:
        return "failed"
    part = SimulationPart.objects.get(simulation=sim, index=index)
    if part.result is not None:
        return assemble(sim.pk)
    configs = [parse_config(c) for c in (sim.configurations or ["baseline"])]
    now = timezone.now()
    SimulationPart.objects.filter(pk=part.pk).update(started_at=now, heartbeat_at=now, worker=worker)
    last = [0.0]

    def progress(name: str, fraction: float) -> None:
        if time.monotonic() - last[0] >= 1.0 or fraction >= 1:
            last[0] = time.monotonic()
            SimulationPart.objects.filter(pk=part.pk).update(
                progress=min(1.0, fraction), heartbeat_at=timezone.now()
            )
            overall = SimulationPart.objects.filter(simulation=sim).aggregate(p=Avg("progress"))["p"] or 0.0
            Simulation.objects.filter(pk=sim.pk, state=Simulation.State.RUNNING).update(
                progress=min(1.0, overall)
            )

    try:
        result = run_all(
            cluster_document(sim.cluster),
            configs,
            days=sim.days,
            seed=sim.seed,
            jobs=sim.jobs,
            elastic_share=sim.elastic_share,
            progress=progress,
            only=index,
        )[0]
    except Exception as exc:  # noqa: BLE001 - the record says what went wrong; the worker carries on
        _fail(sim.pk, f"{configs[index]['name']}: {type(exc).__name__}: {exc}")
        return "failed"
    SimulationPart.objects.filter(pk=part.pk).update(result=result, progress=1.0, finished_at=timezone.now())
    return assemble(sim.pk)


def assemble(simulation_id: int) -> str:
    """Once every part has its results: the report and the summary, written once."""
    with transaction.atomic():
        sim = Simulation.objects.select_for_update().get(pk=simulation_id)
        if sim.state != Simulation.State.RUNNING:
            return sim.state
        parts = list(sim.parts.order_by("index"))
        if any(p.result is None for p in parts):
            return "waiting"
        results = [p.result for p in parts]
        path = report_path(sim)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_report(results, path)
        summary = [{k: v for k, v in r.items() if k != "series"} for r in results]
        Simulation.objects.filter(pk=sim.pk).update(
            state=Simulation.State.DONE,
            progress=1.0,
            summary={"results": summary, "workers": sorted({p.worker for p in parts if p.worker})},
            finished_at=timezone.now(),
        )
    return "done"


def restart_silent_parts(now=None) -> list[tuple[int, int]]:
    """Parts whose worker has been silent for SIMULATION_LEASE_S (a worker killed mid-run) go back
    to the simulations queue, for any worker to take; a kept result is never computed again.
    Returns the (simulation, index) pairs started again."""

    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.SIMULATION_LEASE_S)
    restarted = []
    silent = SimulationPart.objects.filter(
        simulation__state=Simulation.State.RUNNING, result__isnull=True, heartbeat_at__lt=cutoff
    )
    for part in silent:
        # the lease taken over once, by whoever updates it first
        if SimulationPart.objects.filter(pk=part.pk, heartbeat_at=part.heartbeat_at).update(heartbeat_at=now):
            transaction.on_commit(
                lambda s=part.simulation_id, i=part.index: simulation_parts_wanted.send(
                    sender=Simulation, simulation=s, indices=[i]
                )
            )
            restarted.append((part.simulation_id, part.index))
    return restarted


def _fail(simulation_id: int, error: str) -> None:
    Simulation.objects.filter(pk=simulation_id).exclude(state=Simulation.State.FAILED).update(
        state=Simulation.State.FAILED, error=error, finished_at=timezone.now()
    )
