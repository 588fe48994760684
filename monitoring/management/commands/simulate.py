"""What-if simulation of a cluster: the production scheduler, classifier and recovery planner on a
virtual clock over a seeded workload; prints a summary, writes summary.json and report.html."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from cluster.topology_files import load_document
from engine.presets import PRESETS
from engine.topology_spec import TopologyError
from monitoring.models import Simulation
from monitoring.tasks import run_simulation_task
from monitoring.whatif.simreport import (
    COMPARISON_HEADER,
    comparison_rows,
    parse_config,
    run_all,
    topology_document,
    write_report,
)


class Command(BaseCommand):
    help = (
        "Simulate a cluster (preset demo, 10k, 100k or a topology file) for --days with a seeded "
        "workload (calibrated to the Philly and Acme traces, plus large pretraining gangs) or a workload "
        "file; --compare runs several configurations on the same seed and workload "
        "(e.g. --compare checkpoint=periodic:3600 checkpoint=async spares=4)."
    )

    def add_arguments(self, parser):
        parser.add_argument("cluster", help="preset name (demo, 10k, 100k) or a YAML/JSON topology file")
        parser.add_argument("--days", type=float, default=7.0)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--jobs", type=int, default=None, help="trace-calibrated jobs (default: from the load)"
        )
        parser.add_argument(
            "--elastic", type=float, default=0.0, help="share of pretraining gangs that are elastic"
        )
        parser.add_argument(
            "--workload", default=None, help="CSV or JSON workload file instead of the generator"
        )
        parser.add_argument(
            "--inference",
            type=float,
            default=0.1,
            help="share of the largest chip type for a diurnal chat service (0: none)",
        )
        parser.add_argument(
            "--trace", default="kalos", choices=["kalos", "helios"], help="job sizes and outcomes to follow"
        )
        parser.add_argument("--compare", nargs="+", default=None, metavar="CONFIG")
        parser.add_argument(
            "--check-invariants", action="store_true", help="run the invariant checker every cycle"
        )
        parser.add_argument("--out", default=str(Path(settings.DATA_DIR) / "simulation"))
        parser.add_argument(
            "--on-workers",
            action="store_true",
            help="store the simulation and run each configuration as a task on the simulations workers "
            "(a preset or 'inventory' cluster); waits for them and writes the same files",
        )

    def handle(self, *args, **opts):
        if not 0 < opts["days"] <= 365:
            raise CommandError("--days must be between 0 and 365")
        if not 0 <= opts["elastic"] <= 1:
            raise CommandError("--elastic is a share between 0 and 1")
        if not 0 <= opts["inference"] <= 0.9:
            raise CommandError("--inference is a share between 0 and 0.9")
        results = self._on_workers(opts) if opts["on_workers"] else self._here(opts)
        rows = comparison_rows(results)
        widths = [max(len(str(x)) for x in col) for col in zip(COMPARISON_HEADER, *rows, strict=True)]
        for row in (COMPARISON_HEADER, *rows):
            self.stdout.write(
                "  ".join(str(x if x is not None else "-").ljust(w) for x, w in zip(row, widths, strict=True))
            )
        out = Path(opts["out"])
        out.mkdir(parents=True, exist_ok=True)
        summary = [{k: v for k, v in r.items() if k != "series"} for r in results]
        (out / "summary.json").write_text(json.dumps(summary if len(summary) > 1 else summary[0], indent=2))
        write_report(results, out / "report.html")
        self.stdout.write(f"wrote {out / 'summary.json'} and {out / 'report.html'}")

    def _here(self, opts) -> list[dict]:
        try:
            doc = topology_document(opts["cluster"], load_document)
            configs = [parse_config(c) for c in (opts["compare"] or ["baseline"])]
        except (TopologyError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        tty = sys.stdout.isatty()
        done: set[str] = set()

        def progress(name: str, fraction: float) -> None:
            bar = "#" * int(30 * fraction)
            line = f"{name:<28} [{bar:<30}] {fraction:5.0%}"
            if tty:
                self.stdout.write("\r" + line, ending="" if fraction < 1 else "\n")
                self.stdout.flush()
            elif fraction >= 1 and name not in done:
                self.stdout.write(line)
            if fraction >= 1:
                done.add(name)

        try:
            return run_all(
                doc,
                configs,
                days=opts["days"],
                seed=opts["seed"],
                jobs=opts["jobs"],
                workload=opts["workload"],
                elastic_share=opts["elastic"],
                inference_share=opts["inference"],
                trace=opts["trace"],
                check_invariants=opts["check_invariants"],
                progress=progress,
            )
        except (TopologyError, ValueError, OSError) as exc:
            raise CommandError(str(exc)) from exc

    def _on_workers(self, opts) -> list[dict]:
        """A stored simulation, one task per configuration (as POST /api/v1/simulations/ runs it)."""

        if opts["cluster"] not in PRESETS and opts["cluster"] != "inventory":
            raise CommandError(
                f"--on-workers runs a preset ({', '.join(PRESETS)}) or 'inventory', not a file"
            )
        for flag, value, default in (
            ("--workload", opts["workload"], None),
            ("--inference", opts["inference"], 0.1),
            ("--trace", opts["trace"], "kalos"),
            ("--check-invariants", opts["check_invariants"], False),
        ):
            if value != default:
                raise CommandError(f"{flag} is not available with --on-workers")
        try:
            for text in opts["compare"] or []:
                parse_config(text)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        sim = Simulation.objects.create(
            name=f"simulate {opts['cluster']}",
            cluster=opts["cluster"],
            days=opts["days"],
            seed=opts["seed"],
            jobs=opts["jobs"],
            elastic_share=opts["elastic"],
            configurations=opts["compare"] or [],
            created_by="manage.py simulate",
        )
        run_simulation_task.delay(sim.pk)
        self.stdout.write(f"simulation {sim.pk}: {len(opts['compare'] or [1])} configuration task(s) sent")
        shown = -1
        while True:
            sim.refresh_from_db()
            if sim.state in (Simulation.State.DONE, Simulation.State.FAILED):
                break
            if int(sim.progress * 10) != shown:
                shown = int(sim.progress * 10)
                self.stdout.write(f"simulation {sim.pk}: {sim.progress:.0%}")
            time.sleep(0.5)
        if sim.state == Simulation.State.FAILED:
            raise CommandError(f"simulation {sim.pk} failed: {sim.error}")
        workers = ", ".join(sim.summary.get("workers", [])) or "inline"
        self.stdout.write(f"simulation {sim.pk}: done on {workers}")
        return [p.result for p in sim.parts.order_by("index")]
