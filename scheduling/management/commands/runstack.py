from __future__ import annotations

import signal
import subprocess

from django.core.management import call_command
from django.core.management.base import BaseCommand

from scheduling.worker import worker_command


class Command(BaseCommand):
    help = (
        "Run the whole stack on one machine: a Celery worker with beat (scheduling cycles) in a child "
        "process and the ASGI server (HTTP and websockets) in the foreground. Ctrl-C stops both."
    )

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")

    def handle(self, *args, addrport: str, **options):
        worker = subprocess.Popen(worker_command(beat=True))
        self.stdout.write(f"Celery worker with beat started (pid {worker.pid})")
        try:
            call_command("runserver", addrport, use_reloader=False)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
