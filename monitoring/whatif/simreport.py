"""Running what-if simulations from a cluster description, and their self-contained HTML report.

A configuration is a name and a few settings over a baseline: checkpoint policy
(``checkpoint=periodic:3600``, ``async``, ``triggered``, ``async:900``), spare nodes per pod
(``spares=4``), scheduling period (``cycle=60``), the fault-rate swing over the day
(``swing=0.4``). Every configuration of one comparison runs the same seed and the same workload.
"""

from __future__ import annotations

import copy
import csv
import json
from dataclasses import replace
from pathlib import Path

from engine.checkpoint import CheckpointKind
from engine.chips import BY_NAME
from engine.ettr import ETTR_BUCKETS
from engine.network import datacenter_links
from engine.policy import CheckpointPolicy
from engine.presets import PRESETS, preset_document
from engine.sites import SPAN_POLICIES, SiteLinks, links_from_spec
from engine.synthetic import snapshot_from_spec
from engine.tiers import DEFAULT_REPLICA_GROUPS, RecoveryTier, validate_replica_groups
from engine.topology_spec import parse_topology
from engine.workload import Queueing
from sim.config import SimConfig
from sim.simulation import Simulation
from sim.workload import default_services, generate, load_workload

KEYS = ("checkpoint", "tier", "spares", "cycle", "swing", "span", "margin", "links", "queueing")


def parse_config(text: str) -> dict:
    """``name=...`` settings, comma-separated: "checkpoint=periodic:3600,spares=4",
    "checkpoint=triggered,tier=replica_groups:16" (a recovery tier of engine.tiers, with the number
    of replica groups for ``replica_groups``), "span=never" (engine.sites' span policy),
    "margin=0.3" (its margin), "links=0.5" (every datacenter link's lanes at half their rate),
    "queueing=strict_fifo" (every queue's strategy: backfill, strict_fifo, best_effort). With
    ``span`` a generated workload's pretraining gangs may span datacenters (topology ``region``)."""
    settings: dict = {"name": text}
    if text == "baseline":
        return settings
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key not in KEYS or not value:
            raise ValueError(
                f"configuration {text!r}: {part!r} is not one of {', '.join(k + '=' for k in KEYS)}"
            )
        try:
            if key == "checkpoint":
                kind, _, interval = value.partition(":")
                settings[key] = CheckpointPolicy(CheckpointKind(kind), float(interval) if interval else None)
            elif key == "tier":
                tier, _, groups = value.partition(":")
                settings[key] = (RecoveryTier(tier), int(groups) if groups else DEFAULT_REPLICA_GROUPS)
                validate_replica_groups(settings[key][1])
            elif key == "spares":
                settings[key] = int(value)
            elif key == "queueing":
                settings[key] = Queueing(value)
            elif key == "span":
                if value not in SPAN_POLICIES:
                    raise ValueError(value)
                settings[key] = value
            else:
                settings[key] = float(value)
        except ValueError:
            raise ValueError(f"configuration {text!r}: bad value for {key}: {value!r}") from None
    return settings


def topology_document(source: str, loader=None) -> dict:
    if source in PRESETS:
        return preset_document(source)
    if loader is None:
        raise ValueError(f"unknown preset {source!r}; known: {', '.join(PRESETS)}")
    return loader(source)


def with_spares(doc: dict, spares: int) -> dict:
    doc = copy.deepcopy(doc)
    for region in doc.get("regions", []):
        for dc in region.get("datacenters", []):
            for group in dc.get("pods", []):
                group["spare_nodes"] = spares
    return doc


def read_workload(path: str, chips: set[str]):
    p = Path(path)
    if p.suffix.lower() == ".json":
        rows = json.loads(p.read_text())
        if not isinstance(rows, list):
            raise ValueError(f"{p.name}: a JSON workload is a list of job objects")
    else:
        with p.open(newline="") as f:
            rows = list(csv.DictReader(f))
    return load_workload(rows, chips, where=p.name)


def _sim_config(config: dict, days: float, seed: int, check_invariants: bool) -> SimConfig:
    """The simulator's settings for one parsed configuration."""
    sim_config = SimConfig(days=days, seed=seed, name=config["name"], check_invariants=check_invariants)
    if "checkpoint" in config:
        sim_config = replace(sim_config, checkpoint=config["checkpoint"])
    if "tier" in config:
        tier, groups = config["tier"]
        sim_config = replace(
            sim_config, checkpoint=replace(sim_config.checkpoint, tier=tier, replica_groups=groups)
        )
    if "cycle" in config:
        sim_config = replace(sim_config, cycle_period_s=config["cycle"])
    if "swing" in config:
        sim_config = replace(sim_config, fleet=replace(sim_config.fleet, temperature_swing=config["swing"]))
    if "span" in config or "margin" in config:
        scheduler = replace(
            sim_config.scheduler,
            span_policy=config.get("span", sim_config.scheduler.span_policy),
            span_margin=config.get("margin", sim_config.scheduler.span_margin),
        )
        sim_config = replace(sim_config, scheduler=scheduler)
    return sim_config


def run_all(
    doc: dict,
    configs: list[dict],
    *,
    days: float,
    seed: int,
    jobs: int | None,
    workload: str | None = None,
    elastic_share: float = 0.0,
    inference_share: float = 0.1,
    trace: str = "kalos",
    check_invariants: bool = False,
    progress=None,
    only: int | None = None,
) -> list[dict]:
    """Every configuration on the same workload (drawn for the first configuration's cluster);
    ``only``: just that configuration (one task of a sweep), on that same workload."""
    results = []
    shared_jobs = None
    for index, config in enumerate(configs):
        if only is not None and index != only and shared_jobs is not None:
            continue
        spec = parse_topology(with_spares(doc, config["spares"]) if "spares" in config else doc, set(BY_NAME))
        topo = snapshot_from_spec(spec)
        capacity = {c: n for c, n in topo.count_by_chip().items() if n}
        if shared_jobs is None:
            if workload:
                shared_jobs = read_workload(workload, set(capacity))
            else:
                shared_jobs = generate(
                    capacity, days, seed=seed, jobs=jobs, elastic_share=elastic_share, trace=trace
                )
        if only is not None and index != only:
            continue
        sim_config = _sim_config(config, days, seed, check_invariants)
        run_jobs = shared_jobs
        if "span" in config and not workload:  # the generated pretraining gangs may span datacenters
            run_jobs = [replace(j, topology="region") if j.queue == "pretrain" else j for j in shared_jobs]
        links = links_from_spec(spec)
        if "links" in config:
            links = SiteLinks(
                [replace(k, lane_gbps=k.lane_gbps * config["links"]) for k in links.links.values()]
            )
        sim = Simulation(
            topo,
            run_jobs,
            sim_config,
            datacenter_links=datacenter_links(spec),
            services=default_services(capacity, inference_share),
            site_links=links,
        )
        if "queueing" in config:  # every queue admits by the configured strategy
            sim.queues = [replace(q, queueing=config["queueing"]) for q in sim.queues]
        results.append(
            sim.run(progress=(lambda f, name=config["name"]: progress(name, f)) if progress else None)
        )
    return results


def _busiest(sites: dict) -> str:
    return f"{sites['busiest_link'] or '-'} {(sites['busiest_link_peak_utilization'] or 0):.0%}"


def comparison_rows(results: list[dict]) -> list[tuple]:
    rows = []
    for r in results:
        pt = r["pending_time_by_size"]
        big = pt.get("513-2048") or pt.get("2049+") or {}
        rows.append(
            (
                r["name"],
                f"{r['utilization']['allocated_mean']:.1%}",
                f"{r['ettr']['gpu_weighted']:.2%}" if r["ettr"]["gpu_weighted"] is not None else "-",
                r["jobs"]["ended"],
                r["faults"]["interruptions"],
                r["recoveries"]["median_s"],
                big.get("p50_s"),
                f"{r['sites']['crossing_gpu_hours_share']:.2%}",
                _busiest(r["sites"]),
                f"{r['engine']['wall_s']:.1f}",
            )
        )
    return rows


COMPARISON_HEADER = (
    "configuration",
    "allocated",
    "ETTR (training >= 512 GPUs)",
    "jobs ended",
    "interruptions",
    "median recovery s",
    "p50 wait, 513+ GPUs (s)",
    "GPU-h across sites",
    "busiest link (peak)",
    "wall s",
)


COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"]  # Okabe-Ito


def _colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def _line_charts(go, results: list[dict]) -> list:
    """Samples over time, one line per configuration."""

    def line_chart(title, ytitle, value):
        fig = go.Figure()
        for i, r in enumerate(results):
            s = r["series"]["samples"]
            x, y = [p["t"] / 3600 for p in s], [value(p, r) for p in s]
            fig.add_trace(go.Scatter(x=x, y=y, name=r["name"], line={"color": _colour(i)}))
        fig.update_layout(title=title, xaxis_title="hours", yaxis_title=ytitle, template="plotly_white")
        return fig

    return [
        line_chart("GPUs allocated", "% of GPUs", lambda x, r: 100 * x["allocated"] / r["gpus"]),
        line_chart("Queue length", "pending jobs", lambda x, r: x["pending_jobs"]),
        line_chart("GPUs out of service", "GPUs", lambda x, r: x["down_gpus"]),
        line_chart("Inference replicas running", "replicas", lambda x, r: x.get("inference_replicas", 0)),
        line_chart(
            "Busiest rack uplink (training traffic from the modelled plans)",
            "% of capacity",
            lambda x, r: 100 * x.get("rack_uplink_util_max", 0),
        ),
    ]


def _pending_chart(go, results: list[dict]):
    fig = go.Figure()
    for i, r in enumerate(results):
        labels = list(r["pending_time_by_size"])
        y = [(r["pending_time_by_size"][k]["p50_s"] or 0) / 60 for k in labels]
        fig.add_trace(go.Bar(x=labels, y=y, name=f"{r['name']} p50", marker_color=_colour(i)))
    fig.update_layout(
        title="Pending time by job size (median)",
        xaxis_title="GPUs",
        yaxis_title="minutes",
        barmode="group",
        template="plotly_white",
    )
    return fig


def _ettr_charts(go, results: list[dict]) -> list:
    losses = go.Figure()
    for b, colour in zip(ETTR_BUCKETS, COLOURS, strict=False):
        y = [100 * r["ettr"]["loss_share"].get(b, 0) for r in results]
        losses.add_trace(
            go.Bar(x=[r["name"] for r in results], y=y, name=b.replace("_", " "), marker_color=colour)
        )
    losses.update_layout(
        title="Where training time is lost (GPU-weighted, training jobs of 512+ GPUs)",
        yaxis_title="% of wall time",
        barmode="stack",
        template="plotly_white",
    )
    per_job = go.Figure()
    for i, r in enumerate(results):
        y = [100 * j["ettr"] for j in r["series"]["ettr_jobs"]]
        per_job.add_trace(go.Box(y=y, name=r["name"], marker_color=_colour(i)))
    per_job.update_layout(title="ETTR per training job", yaxis_title="%", template="plotly_white")
    return [losses, per_job]


def _fault_charts(go, results: list[dict]) -> list:
    r0 = results[0]
    faults = go.Figure()
    for i, cause in enumerate(sorted({f[1] for f in r0["series"]["faults"]})):
        times = [f[0] / 3600 for f in r0["series"]["faults"] if f[1] == cause]
        faults.add_trace(
            go.Scatter(
                x=times,
                y=[cause] * len(times),
                mode="markers",
                name=cause,
                marker={"color": _colour(i), "size": 6},
            )
        )
    faults.update_layout(
        title=f"Faults by cause ({r0['name']})",
        xaxis_title="hours",
        template="plotly_white",
        showlegend=False,
    )
    recovery = go.Figure()
    for i, r in enumerate(results):
        x = [x[2] for x in r["series"]["recoveries"]]
        recovery.add_trace(go.Histogram(x=x, name=r["name"], marker_color=_colour(i), opacity=0.7))
    recovery.update_layout(
        title="Time to recover", xaxis_title="seconds", barmode="overlay", template="plotly_white"
    )
    return [faults, recovery]


def write_report(results: list[dict], path: Path) -> None:
    """One self-contained HTML file (plotly.js inline) with every chart of every configuration."""
    import plotly.graph_objects as go
    import plotly.io as pio

    figures = [
        *_line_charts(go, results),
        _pending_chart(go, results),
        *_ettr_charts(go, results),
        *_fault_charts(go, results),
    ]
    table = "".join(
        "<tr>" + "".join(f"<td>{cell if cell is not None else '-'}</td>" for cell in row) + "</tr>"
        for row in comparison_rows(results)
    )
    header = "".join(f"<th>{h}</th>" for h in COMPARISON_HEADER)
    parts = [pio.to_html(f, full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figures)]
    first = results[0]
    html = f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Myriad simulation: {first["gpus"]:,} GPUs, {first["days"]:g} days</title>
<style>body{{font:14px system-ui,sans-serif;margin:24px}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} th{{background:#f4f4f4}}</style></head><body>
<h1>Simulation: {first["gpus"]:,} GPUs, {first["days"]:g} days, seed {first["seed"]}</h1>
<table><thead><tr>{header}</tr></thead><tbody>{table}</tbody></table>
{"".join(parts)}
</body></html>"""
    path.write_text(html)
