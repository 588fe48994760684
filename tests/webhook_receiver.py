"""A webhook receiver for the tests, run as its own process on loopback:

    python -m tests.webhook_receiver PORT OUT [--fail N] [--hang S]

Each POST is appended to OUT as one JSON line (path, headers, body); the first N answer 500, the
rest 204; with --hang every request waits S seconds before answering (a receiver that stalls)."""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("out")
    parser.add_argument("--fail", type=int, default=0)
    parser.add_argument("--hang", type=float, default=0.0)
    args = parser.parse_args()
    lock = threading.Lock()
    seen = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                seen[0] += 1
                n = seen[0]
                with open(args.out, "a") as out:
                    record = {"path": self.path, "headers": dict(self.headers), "body": body.decode()}
                    out.write(json.dumps(record) + "\n")
            if args.hang:
                time.sleep(args.hang)
            self.send_response(500 if n <= args.fail else 204)
            self.end_headers()

        def log_message(self, *_args):
            pass

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
