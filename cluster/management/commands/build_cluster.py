from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from cluster.builder import InventoryExists, build_cluster, inventory_exists
from cluster.topology_files import resolve_topology
from engine.presets import PRESETS
from engine.topology_spec import TopologyError


class Command(BaseCommand):
    help = (
        "Build the cluster inventory from a preset ("
        + ", ".join(PRESETS)
        + ") or a YAML/JSON topology file. "
        "The file is validated first; on any error nothing is written."
    )

    def add_arguments(self, parser):
        parser.add_argument("source", help="preset name or path to a topology file")
        parser.add_argument("--replace", action="store_true", help="delete the existing cluster and rebuild")
        parser.add_argument(
            "--if-empty", action="store_true", help="do nothing (and succeed) when a cluster already exists"
        )
        parser.add_argument("--check", action="store_true", help="only validate the topology; write nothing")

    def handle(self, *args, source: str, replace: bool, if_empty: bool, check: bool, **options):
        try:
            spec = resolve_topology(source)
        except TopologyError as exc:
            raise CommandError(str(exc)) from None
        summary = (
            f"{spec.total_gpus} GPUs on {spec.total_nodes} nodes in "
            f"{sum(len(r.datacenters) for r in spec.regions)} datacenters, {len(spec.regions)} regions"
        )
        if check:
            self.stdout.write(f"{source}: valid: {summary}")
            return
        if if_empty and inventory_exists():
            self.stdout.write("A cluster already exists; leaving it as it is.")
            return
        started = time.perf_counter()
        try:
            result = build_cluster(spec, replace=replace)
        except InventoryExists as exc:
            raise CommandError(f"{exc} (use --replace, or --if-empty to keep it)") from None
        elapsed = time.perf_counter() - started
        self.stdout.write(
            self.style.SUCCESS(
                f"Built {source}: {result.gpus} GPUs, {result.nodes} nodes, {result.racks} racks, "
                f"{result.pods} pods, {result.datacenters} datacenters, {result.regions} regions, "
                f"{result.links} datacenter links in {elapsed:.1f} s"
            )
        )
