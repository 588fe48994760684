"""Parallel plans for jobs that describe their model: the engine's step-time model applied to
where a job actually runs (how many GPUs, which chip, how far its GPUs spread)."""

from __future__ import annotations

import numpy as np

from cluster.models import Datacenter, DatacenterLink
from engine.mixedplan import mixed_plan
from engine.sites import one_site_step_s, span_plan
from engine.stagecut import stage_ranges
from engine.steptime import SPAN_LEVELS, Fabric, ModelSpec, NoFeasiblePlan, best_plan, rank_chips
from scheduling import sites
from scheduling.choices import EventKind
from scheduling.models import JobEvent


def model_of(job) -> ModelSpec | None:
    if not job.model:
        return None
    return ModelSpec.from_dict(job.model)


def datacenters_of(snapshot, held) -> np.ndarray:
    """The datacenter index of each of the GPU indices ``held``."""
    return snapshot.pod_datacenter[snapshot.rack_pod[snapshot.node_rack[snapshot.gpu_node[held]]]]


def span_of(snapshot, held: np.ndarray) -> tuple[int, list[int]]:
    """(lowest common level index in SPAN_LEVELS, database ids of the datacenters spanned)."""
    nodes = snapshot.gpu_node[np.asarray(held, dtype=np.int64)]
    if len(nodes) == 0:
        return 0, []
    racks = snapshot.node_rack[nodes]
    pods = snapshot.rack_pod[racks]
    dcs = datacenters_of(snapshot, np.asarray(held, dtype=np.int64))
    regions = snapshot.datacenter_region[dcs]
    dc_ids = sorted(int(snapshot.datacenter_id[d]) for d in np.unique(dcs))
    for level, values in enumerate((nodes, racks, pods, dcs, regions)):
        if np.all(values == values[0]):
            return level, dc_ids
    return len(SPAN_LEVELS) - 1, dc_ids


def _fabric(dc_ids: list[int]) -> Fabric:
    """The fabric of a mixed-chip plan across datacenters: the slowest link's capacity now."""
    if len(dc_ids) < 2:
        return Fabric()
    links = DatacenterLink.objects.filter(a_id__in=dc_ids, b_id__in=dc_ids)
    slowest = min((link.capacity_gbps for link in links), default=0.0)
    # without a link up the traffic goes over the WAN: the default cross-region figure
    return Fabric(datacenter_link_gbps=(slowest / 8) if slowest else 5 / 8)


def _across_sites(job, model, chip: str, snapshot, held: np.ndarray, dc_ids: list[int]) -> dict:
    """The plan of a job across datacenters (engine.sites.span_plan: whole replicas in each
    datacenter, the gradients over what the links leave it, or the pipeline cut at the links),
    with what runs in each datacenter."""
    index, counts = np.unique(datacenters_of(snapshot, held), return_counts=True)
    split = {int(snapshot.datacenter_id[i]): int(n) for i, n in zip(index, counts, strict=True)}
    room = sites.room_for(getattr(job, "pk", None), dc_ids)
    if room is None:
        return {
            "error": "a link between its datacenters is down or missing",
            "gpus": int(len(held)),
            "chip": chip,
        }
    found = span_plan(model, chip, split, *room)
    if found is None:
        return {
            "error": "no plan keeps whole model replicas or whole pipeline stages in each datacenter",
            "gpus": int(len(held)),
            "chip": chip,
        }
    plan = found.plan
    data = plan.as_dict()
    names = dict(Datacenter.objects.filter(pk__in=list(split)).values_list("pk", "name"))
    data["cut"] = found.cut
    data["sites"] = [
        {"datacenter": names.get(dc, str(dc)), "gpus": split[dc], found.cut: n} for dc, n in found.parts
    ]
    if found.cut == "stages":  # which stages each datacenter holds, in pipeline order: "1-10"
        for site, stages in zip(data["sites"], stage_ranges(n for _, n in found.parts), strict=True):
            site["stage_range"] = stages
    data["link_room_gbps"] = round(room[0] * 8 / 1e9, 1)
    one = one_site_step_s(model, chip, int(len(held)))
    if one:
        data["one_site_step_s"] = round(one, 4)
        data["slowdown"] = round(plan.step_s / one - 1, 4)  # over the same GPUs in one datacenter
    return data


def plan_for(job, chip: str, snapshot, held: np.ndarray, parts=()) -> dict:
    """The modelled plan of ``job`` on these GPUs; {} without a model, {"error": ...} if none fits.
    ``parts``: (chip, GPUs) per chip type of a mixed-chip job."""
    model = model_of(job)
    if model is None or len(held) == 0:
        return {}
    level, dc_ids = span_of(snapshot, held)
    if len(parts) > 1:
        try:
            mixed = mixed_plan(
                model, dict(parts), fabric=_fabric(dc_ids), span_level=level, datacenters=max(1, len(dc_ids))
            )
        except (NoFeasiblePlan, KeyError) as exc:
            return {"error": str(exc), "gpus": int(len(held)), "chip": "+".join(c for c, _ in parts)}
        data = mixed.as_dict()
        data.update(mixed=True, gpus=int(len(held)), span=SPAN_LEVELS[level], datacenters=max(1, len(dc_ids)))
        return data
    try:
        if len(dc_ids) > 1:
            data = _across_sites(job, model, chip, snapshot, held, dc_ids)
        else:
            data = best_plan(model, chip, len(held), span_level=level).as_dict()
    except (NoFeasiblePlan, KeyError) as exc:
        return {"error": str(exc), "gpus": int(len(held)), "chip": chip}
    if "error" in data:
        return data
    data["span"] = SPAN_LEVELS[level]
    data["datacenters"] = max(1, len(dc_ids))
    return data


def ranking_for(model: dict, gpus: int, chips: list[str]) -> list[dict]:
    return rank_chips(ModelSpec.from_dict(model), gpus, chips)


def plan_summary(plan: dict) -> str:
    if not plan:
        return ""
    if "error" in plan:
        return plan["error"]
    if plan.get("mixed"):
        parts = ", ".join(
            f"TP{p['tp']} PP{p['pp']} DP{p['dp']} on {p['gpus']} {p['chip']}" for p in plan["parts"]
        )
        efficiency = plan.get("efficiency")
        return (
            f"{plan.get('layout', 'mixed')}: {parts}; {plan['step_s']:.2f} s/step, "
            f"{plan['tokens_per_s']:,.0f} tokens/s"
            + (f", mixed efficiency {efficiency:.1%}" if efficiency is not None else "")
        )
    where = ""
    if plan.get("sites"):
        if plan.get("cut") == "stages":
            where = "; stages " + ", ".join(f"{s['stage_range']} in {s['datacenter']}" for s in plan["sites"])
        else:
            where = "; replicas " + ", ".join(f"{s['replicas']} in {s['datacenter']}" for s in plan["sites"])
    if plan.get("slowdown") is not None:
        where += f"; {plan['slowdown'] * 100:.1f}% slower than in one datacenter"
    return (
        f"TP{plan['tp']} PP{plan['pp']} DP{plan['dp']}, {plan['step_s']:.2f} s/step, "
        f"{plan['tokens_per_s']:,.0f} tokens/s{where}"
    )


def resize_job(job, snapshot, held: np.ndarray, *, at, reason: str, **extra):
    """Re-plan ``job`` on its new GPU set, save its size and plan, and return the unsaved
    ``resized`` event carrying the old and new plan and the modelled throughput ratio."""

    old_plan = job.plan
    new_plan = plan_for(job, job.chip.name if job.chip else "", snapshot, held)
    old_size = job.allocated_gpus
    job.allocated_gpus, job.plan = int(len(held)), new_plan
    job.save(update_fields=["allocated_gpus", "plan"])
    data = {
        "old_gpus": old_size,
        "new_gpus": job.allocated_gpus,
        "old_plan": old_plan,
        "new_plan": new_plan,
        **extra,
    }
    if old_plan.get("tokens_per_s") and new_plan.get("tokens_per_s"):
        data["throughput_ratio"] = new_plan["tokens_per_s"] / old_plan["tokens_per_s"]
    if new_plan and "error" not in new_plan:
        reason += f"; re-planned {plan_summary(new_plan)}"
    return JobEvent(job=job, kind=EventKind.RESIZED, at=at, reason=reason, data=data)
