"""Check the committed state against what must never happen (scheduling.invariants)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from scheduling.invariants import check_database


class Command(BaseCommand):
    help = (
        "Check the database: no GPU held beyond its capacity, every quota rule kept, no active "
        "allocation of a job that is not running, no running job without GPUs or that had ended. "
        "Exits with 1 and lists the problems when one is broken."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")

    def handle(self, *args, **options):
        report = check_database()
        if options["json"]:
            self.stdout.write(json.dumps({**report.__dict__, "problems": report.problems}))
        elif not report.problems:
            self.stdout.write("no invariant broken")
        if report.problems:
            raise CommandError("; ".join(report.problems))
