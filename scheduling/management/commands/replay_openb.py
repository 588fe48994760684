"""Replay the openb GPU-sharing trace by the FGD paper's protocol; compare with its published curves."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from sim import openb_replay as rp


def _seeds(text: str) -> list[int]:
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CommandError(f"--seeds: give a range like 42-51 or a list like 42,43; got {text!r}") from None
    if not seeds or len(seeds) > 1000:
        raise CommandError(f"--seeds: between 1 and 1000 seeds; got {text!r}")
    return seeds


class Command(BaseCommand):
    help = (
        "Replay Alibaba's openb GPU-sharing trace (1,213 nodes, 6,212 GPUs) by the FGD paper's protocol: "
        "tasks shuffled per seed, inflated to --target of GPU capacity, each tried once, never leaving. "
        "Prints the allocated share at 100%% and 130%% per list and policy beside the published figures; "
        "writes curves.csv (every list, policy and seed) and a self-contained replay.html."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--lists", default="default", help=f"comma-separated, or 'all': {', '.join(rp.LISTS)}"
        )
        parser.add_argument("--policies", default=",".join(rp.POLICIES), help=", ".join(rp.POLICIES))
        parser.add_argument("--seeds", default="42-51", help="a range (42-51, the paper's) or a list")
        parser.add_argument("--target", type=float, default=1.3, help="requested share to inflate to")
        parser.add_argument("--traces", default=str(rp.DATA), help="folder with the node and task lists")
        parser.add_argument("--nodes", default=None, help="node list (default: the folder's GPU nodes)")
        parser.add_argument("--out", default=str(Path(settings.DATA_DIR) / "replay"), help="output folder")

    def handle(self, *args, **opts):
        lists = (
            list(rp.LISTS) if opts["lists"] == "all" else [x.strip() for x in opts["lists"].split(",") if x]
        )
        folder = Path(opts["traces"])
        missing = [n for n in lists if not rp.task_file(folder, n).exists()]
        if not lists or missing:
            raise CommandError(f"--lists: no task list {', '.join(missing) or '(none)'} in {folder}")
        policies = [p.strip() for p in opts["policies"].split(",") if p.strip()]
        unknown = [p for p in policies if p not in rp.POLICIES]
        if unknown or not policies:
            raise CommandError(
                f"--policies: unknown {', '.join(unknown) or '(none)'}; known: {', '.join(rp.POLICIES)}"
            )
        if not 0 < opts["target"] <= 5:
            raise CommandError("--target must be between 0 and 5 (a share of capacity)")
        seeds = _seeds(opts["seeds"])
        started = time.perf_counter()
        try:
            nodes, results = rp.run(
                lists, policies, seeds, folder=folder, nodes_file=opts["nodes"], target=opts["target"]
            )
        except (OSError, rp.TraceError) as exc:
            raise CommandError(str(exc)) from exc
        wall = time.perf_counter() - started
        out = Path(opts["out"])
        out.mkdir(parents=True, exist_ok=True)
        pub = rp.published(folder)
        rp.write_curves(results, out / "curves.csv")
        rp.write_chart(results, out / "replay.html", pub)
        figures = rp.summary(results)
        self.stdout.write(
            f"{len(nodes.names):,} nodes, {nodes.gpu_capacity // 1000:,} GPUs; seeds {seeds[0]}..{seeds[-1]} "
            f"({len(seeds)}), inflated to {opts['target']:.0%}; {wall:.1f} s"
        )
        self.stdout.write(
            f"{'list':<13}{'policy':<15}{'at 100%':>9}{'at 130%':>9}{'published':>21}{'difference':>14}"
        )
        for name, by_policy in figures.items():
            for policy, fig in by_policy.items():
                curve = pub.get((name, policy))
                line = f"{name:<13}{policy:<15}{fig['100']:>9.2f}{fig['130']:>9.2f}"
                if curve and 100 in curve and 130 in curve:
                    p100, p130 = np.mean(curve[100]), np.mean(curve[130])
                    line += f"{p100:>11.2f}{p130:>10.2f}{fig['100'] - p100:>+7.2f}{fig['130'] - p130:>+7.2f}"
                self.stdout.write(line)
        self.stdout.write(
            "Unallocated at the end (mean over seeds, % of GPU capacity): on GPUs wholly free, on GPUs "
            "partly used, and of both where no GPU task of the list fits any more (share, GPUs, CPU, memory, "
            "model)"
        )
        self.stdout.write(
            f"{'list':<13}{'policy':<15}{'whole GPUs':>12}{'partial GPUs':>14}{'no task fits':>14}"
        )
        for (name, policy), parts in rp.unallocated_summary(results, nodes.gpu_capacity).items():
            self.stdout.write(
                f"{name:<13}{policy:<15}{parts['whole_gpus']:>12.2f}{parts['partial_gpus']:>14.2f}"
                f"{parts['no_task_fits']:>14.2f}"
            )
        self.stdout.write(f"wrote {out / 'curves.csv'} and {out / 'replay.html'}")
        self.stdout.write(json.dumps(figures))
