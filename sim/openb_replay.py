"""Running the openb replay over task lists, policies and seeds, against the published curves.

The published figures (``data/openb/published_allocation.csv``) are the FGD paper simulator's
expected results (hkust-adsl/kubernetes-scheduler-simulator,
``experiments/analysis/expected_results/analysis_allo_discrete.csv``, Apache-2.0): for each task
list, policy (Random, BestFit, FGD) and seed 42-51, the allocated share of GPU capacity (%) at
every whole percent of requested capacity from 0 to 130.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import numpy as np

from engine.packing_replay import POLICIES, ReplayCurve, mix_for, replay
from sim.openb import TraceError, load_nodes, load_tasks

DATA = Path(__file__).resolve().parent.parent / "data" / "openb"
NODE_LIST = "openb_node_list_gpu_node.csv"
LISTS = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)
SEEDS = tuple(range(42, 52))
PUBLISHED = "published_allocation.csv"


def task_file(folder: Path, name: str) -> Path:
    return Path(folder) / f"openb_pod_list_{name}.csv"


def published(folder: Path = DATA) -> dict[tuple[str, str], dict[int, list[float]]]:
    """(list, policy) -> percent -> the published figure of each seed."""
    out: dict[tuple[str, str], dict[int, list[float]]] = {}
    path = Path(folder) / PUBLISHED
    if not path.exists():
        return out
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            curve = out.setdefault((row["list"], row["policy"]), {})
            for p in range(131):
                if row.get(str(p)):
                    curve.setdefault(p, []).append(float(row[str(p)]))
    return out


def run(lists, policies, seeds, *, folder: Path = DATA, nodes_file: Path | None = None, target=1.3):
    """Replay every list x policy x seed: {(list, policy): [(seed, curve, wall_s), ...]}."""
    nodes = load_nodes(nodes_file or Path(folder) / NODE_LIST)
    results: dict[tuple[str, str], list[tuple[int, ReplayCurve, float]]] = {}
    for name in lists:
        tasks = load_tasks(task_file(folder, name))
        for policy in policies:
            mix = mix_for(policy, tasks, nodes.models)
            for seed in seeds:
                started = time.perf_counter()
                curve = replay(nodes, tasks, policy, target=target, seed=seed, mix=mix)
                results.setdefault((name, policy), []).append((seed, curve, time.perf_counter() - started))
    return nodes, results


def summary(results, percents=(100, 130)) -> dict[str, dict[str, dict[str, float]]]:
    """{list: {policy: {"100": mean over seeds, "130": ...}}}, the replay's JSON line."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (name, policy), runs in results.items():
        out.setdefault(name, {})[policy] = {
            str(p): round(float(np.mean([c.allocated_at(p) for _, c, _ in runs])), 2) for p in percents
        }
    return out


def unallocated_summary(results, capacity: int) -> dict[tuple[str, str], dict[str, float]]:
    """(list, policy) -> where the capacity left unallocated at the end of the runs sits
    (``engine.packing_replay.unallocated``), the mean over seeds in % of GPU capacity."""
    out = {}
    for key, runs in results.items():
        parts = runs[0][1].unallocated
        out[key] = {
            part: round(float(np.mean([c.unallocated[part] for _, c, _ in runs])) * 100 / capacity, 2)
            for part in parts
        }
    return out


def write_curves(results, path: Path, last: int = 130) -> None:
    """One row per list, policy and seed: the figure at every whole percent reached."""
    with Path(path).open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["list", "policy", "seed", "failed_tasks", *range(last + 1)])
        for (name, policy), runs in results.items():
            for seed, curve, _ in runs:
                points = curve.points(last)
                writer.writerow(
                    [name, policy, seed, curve.failed, *(points.get(p, "") for p in range(last + 1))]
                )


COLOURS = {"random": "#E69F00", "best-fit": "#56B4E9", "fgd": "#CC79A7", "fragmentation": "#009E73"}


def write_chart(results, path: Path, pub, last: int = 130) -> None:
    """A self-contained HTML page: per list, the mean curve of each policy, the published curves
    dashed beside them."""
    import plotly.graph_objects as go

    parts = []
    for name in dict.fromkeys(n for n, _ in results):
        fig = go.Figure()
        for (lst, policy), runs in results.items():
            if lst != name:
                continue
            xs = list(range(last + 1))
            curves = [c.points(last) for _, c, _ in runs]  # once per run, not once per percent
            ys = [np.mean([pts.get(p, np.nan) for pts in curves]) for p in xs]
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines",
                    name=f"{policy} (Myriad, {len(runs)} seeds)",
                    line={"color": COLOURS.get(policy)},
                )
            )
            curve = pub.get((name, policy))
            if curve:
                px = sorted(curve)
                fig.add_trace(
                    go.Scatter(
                        x=px,
                        y=[np.mean(curve[p]) for p in px],
                        mode="lines",
                        name=f"{policy} (published)",
                        line={"color": COLOURS.get(policy), "dash": "dash"},
                    )
                )
        fig.add_trace(
            go.Scatter(
                x=[0, 100], y=[0, 100], mode="lines", name="ideal", line={"dash": "dot", "color": "#999999"}
            )
        )
        fig.update_layout(
            title=f"openb_pod_list_{name}: GPU capacity allocated as requests arrive",
            xaxis_title="GPU capacity requested (% of cluster)",
            yaxis_title="GPU capacity allocated (% of cluster)",
            yaxis_range=[0, 100],
            template="plotly_white",
            height=480,
        )
        parts.append(fig.to_html(full_html=False, include_plotlyjs=not parts))
    Path(path).write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>openb replay</title></head><body>"
        + "".join(parts)
        + "</body></html>"
    )


__all__ = [
    "LISTS",
    "POLICIES",
    "SEEDS",
    "TraceError",
    "published",
    "run",
    "summary",
    "unallocated_summary",
    "write_chart",
    "write_curves",
]
