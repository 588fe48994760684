"""Replay a node list and a task list through the packing policies; write a CSV and an HTML chart."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from engine.packing import POLICIES, replay
from sim.openb import TraceError, load_nodes, load_tasks

DATA = Path(settings.BASE_DIR) / "data" / "openb"


class Command(BaseCommand):
    help = (
        "Replay a GPU-sharing trace (default: Alibaba openb, 1,213 nodes and 8,152 tasks) through "
        "several placement policies: tasks arrive in order and never leave, then are cloned at random "
        "until requests reach --target of capacity. Prints allocated share at 100%% and the target; "
        "writes replay.csv and a self-contained replay.html."
    )

    def add_arguments(self, parser):
        parser.add_argument("--nodes", default=str(DATA / "openb_node_list_gpu_node.csv"))
        parser.add_argument("--tasks", default=str(DATA / "openb_pod_list_default.csv"))
        parser.add_argument(
            "--policies", default=",".join(POLICIES), help=f"comma-separated: {', '.join(POLICIES)}"
        )
        parser.add_argument(
            "--target", type=float, default=1.3, help="requested share to stop at (1.3 = 130%%)"
        )
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--out", default=str(Path(settings.DATA_DIR) / "replay"), help="output folder")

    def handle(self, *args, **opts):
        policies = [p.strip() for p in opts["policies"].split(",") if p.strip()]
        unknown = [p for p in policies if p not in POLICIES]
        if unknown or not policies:
            raise CommandError(
                f"--policies: unknown {', '.join(unknown) or '(none)'}; known: {', '.join(POLICIES)}"
            )
        if not 0 < opts["target"] <= 5:
            raise CommandError("--target must be between 0 and 5 (a share of capacity)")
        try:
            nodes = load_nodes(opts["nodes"])
            tasks = load_tasks(opts["tasks"])
        except (OSError, TraceError) as exc:
            raise CommandError(str(exc)) from exc
        out = Path(opts["out"])
        out.mkdir(parents=True, exist_ok=True)
        curves, walls = [], {}
        for policy in policies:
            started = time.perf_counter()
            curves.append(replay(nodes, tasks, policy, target=opts["target"], seed=opts["seed"]))
            walls[policy] = time.perf_counter() - started
        with (out / "replay.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["policy", "arrival", "requested_share", "allocated_share"])
            for c in curves:
                for i, (r, a) in enumerate(zip(c.requested, c.allocated, strict=True), start=1):
                    writer.writerow([c.policy, i, f"{r:.5f}", f"{a:.5f}"])
        _chart(curves, out / "replay.html", nodes, len(tasks), opts["target"])
        self.stdout.write(
            f"{len(nodes.names):,} nodes, {nodes.gpu_capacity // 1000:,} GPUs; {len(tasks):,} tasks, "
            f"cloned to {opts['target']:.0%} of capacity (seed {opts['seed']})"
        )
        self.stdout.write(f"{'policy':<15}{'at 100%':>10}{'at target':>10}{'failed':>9}{'wall s':>9}")
        summary = {}
        for c in curves:
            at100, at_target = c.allocated_at(1.0), c.allocated_at(opts["target"])
            self.stdout.write(
                f"{c.policy:<15}{at100:>10.1%}{at_target:>10.1%}{c.failed:>9}{walls[c.policy]:>9.1f}"
            )
            summary[c.policy] = {
                "allocated_at_100": round(at100, 4),
                "allocated_at_target": round(at_target, 4),
                "failed_tasks": c.failed,
                "wall_s": round(walls[c.policy], 2),
            }
        self.stdout.write(f"wrote {out / 'replay.csv'} and {out / 'replay.html'}")
        self.stdout.write(json.dumps(summary))


def _chart(curves, path: Path, nodes, tasks: int, target: float) -> None:
    import plotly.graph_objects as go

    fig = go.Figure()
    colours = {"random": "#E69F00", "best-fit": "#56B4E9", "fragmentation": "#009E73"}
    for c in curves:
        fig.add_trace(
            go.Scatter(
                x=c.requested * 100,
                y=c.allocated * 100,
                mode="lines",
                name=c.policy,
                line={"color": colours.get(c.policy)},
            )
        )
    fig.add_trace(
        go.Scatter(
            x=[0, 100], y=[0, 100], mode="lines", name="ideal", line={"dash": "dot", "color": "#999999"}
        )
    )
    fig.update_layout(
        title=f"GPU capacity allocated as requests arrive ({len(nodes.names):,} nodes, {tasks:,} tasks, "
        f"cloned to {target:.0%})",
        xaxis_title="GPU capacity requested (% of cluster)",
        yaxis_title="GPU capacity allocated (% of cluster)",
        yaxis_range=[0, 100],
        template="plotly_white",
    )
    fig.write_html(path, include_plotlyjs=True, full_html=True)
