"""Inference services in the cluster simulator: each service's replicas follow its load as the
production autoscaler decides (engine.inference.decide), every AUTOSCALE_S of virtual time."""

from __future__ import annotations

from engine.inference import decide
from sim.workload import SimJob

DAY = 86_400.0
AUTOSCALE_S = 300.0


def autoscale(sim) -> None:
    """Each service's replicas follow its load, as the production autoscaler decides."""
    for k, (svc, profile) in enumerate(zip(sim.services, sim.profiles, strict=True)):
        ids = [i for i in sim.replicas[k] if sim.jobs[i].ended is None]
        load = profile.rate(sim.now)
        decision = decide(
            load,
            replicas=len(ids),
            capacity_rps=svc.capacity_rps,
            headroom=svc.headroom,
            min_replicas=svc.min_replicas,
            max_replicas=svc.max_replicas,
            low_since=sim.low_since[k],
            now=sim.now,
            scale_down_delay_s=300.0,
        )
        sim.low_since[k] = (sim.low_since[k] or sim.now) if decision.desired < len(ids) else None
        running = sum(1 for i in ids if i in sim.running)
        sim.replica_seconds[k] += running * AUTOSCALE_S
        sim.short_seconds[k] += max(0, decision.desired - running) * AUTOSCALE_S
        for _ in range(decision.target - len(ids)):
            spec = SimJob(
                sim.new_job_id(),
                "inference",
                svc.replica_gpus,
                sim.now,
                365 * DAY,
                svc.chip,
                "node",
                20,
                "inference",
                parameters=0.0,
            )
            sim.submit(spec)
            ids.append(spec.id)
        if decision.target < len(ids):
            retire = sorted(ids, key=lambda i: (i in sim.running, -i))[: len(ids) - decision.target]
            for job_id in retire:
                sim.retire(job_id)
            sim.low_since[k] = None
        sim.replicas[k] = [i for i in ids if sim.jobs[i].ended is None]
