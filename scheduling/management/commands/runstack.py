from __future__ import annotations

import signal
import subprocess

from django.core.management.base import BaseCommand

from scheduling.worker import APPLICATION, SERVER, worker_command


class Command(BaseCommand):
    help = (
        "Run the whole stack on one machine: a Celery worker with beat (scheduling cycles) in a child "
        "process and the web server (HTTP and websockets: uvicorn, as deployed, one process) in the "
        "foreground. Ctrl-C stops both."
    )

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")

    def handle(self, *args, addrport: str, **options):
        import uvicorn

        host, _, port = addrport.rpartition(":")
        worker = subprocess.Popen(worker_command(beat=True))
        self.stdout.write(f"Celery worker with beat started (pid {worker.pid})")
        self.stdout.write(f"Serving on http://{host or '127.0.0.1'}:{port}/", ending="\n")
        self.stdout.flush()
        try:
            # the production server's settings (scheduling.worker.SERVER), in this process; a response
            # is sent as fast as the client takes it (a streamed scrape is never buffered whole)
            uvicorn.run(
                APPLICATION, host=host or "127.0.0.1", port=int(port), timeout_graceful_shutdown=5, **SERVER
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
