"""Hostile input: schemathesis against the live OpenAPI schema of a running stack.

A whole stack runs (``manage.py runstack``: Celery worker and beat, the simulated fleet) on its
own database, and the production web server (uvicorn, as a deployment runs it) serves the API on a
second port over the same database and stores. Schemathesis then sends every operation of the
schema, with an operator's token, through all its phases (examples, coverage, fuzzing and
stateful sequences that follow links between create, read, update and delete) and checks every
response: no server error (5xx) and a body that matches the schema. Seeded, so a run repeats.

    python -m bench.fuzz [--max-examples 50] [--seed 1] [--max-time 600]

The test suite runs a bounded pass of the same code (tests/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from scheduling.worker import web_command
from tests.browser_stack import ROOT, free_port, start_stack, stop_group

PHASES = "examples,coverage,fuzzing,stateful"
CHECKS = "not_a_server_error,response_schema_conformance"


def _serve_uvicorn(env: dict, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen(
        web_command(port, workers=1),
        cwd=ROOT,
        env=env,
        stdout=open(log, "ab"),  # noqa: SIM115 - the server's output, kept for failures
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/schema/", timeout=5)
            return process, url
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.5)
    stop_group(process)
    raise RuntimeError(f"uvicorn did not answer; see {log}")


def summarize(report: dict) -> dict:
    """The run's figures from schemathesis' JSON report."""
    failures = report.get("failures") or []
    by_type = {f["type"]: f["count"] for f in failures}
    cases = report.get("test_cases") or {}
    return {
        "operations": (report.get("operations") or {}).get("tested", 0),
        "test_cases": cases.get("generated", 0),
        "server_errors": by_type.get("ServerError", 0),
        "schema_violations": by_type.get("JsonSchemaError", 0),
        "failures": sum(by_type.values()),
        "failure_types": by_type,
        "failing_operations": sorted({op for f in failures for op in f.get("operations", [])}),
        "errors": len(report.get("errors") or []),
        "phases": {name: p.get("status") for name, p in (report.get("phases") or {}).items()},
        "seed": report.get("seed"),
    }


def run_fuzz(
    folder: Path, *, max_examples: int, seed: int, max_time: int | None = None, workers: int = 2
) -> dict:
    """Start a stack in ``folder``, fuzz it, stop it; the figures of ``summarize``."""
    stack = start_stack(folder / "stack", "demo", name="fuzz")
    web = None
    try:
        web, url = _serve_uvicorn(stack.env, folder / "uvicorn.log")
        command = [
            sys.executable, "-m", "schemathesis.cli", "run", f"{url}/api/schema/",
            "-H", f"Authorization: Token {stack.tokens['operator']}",
            "--phases", PHASES, "--checks", CHECKS,
            "--seed", str(seed), "--max-examples", str(max_examples), "--workers", str(workers),
            "--request-timeout", "60", "--report", "json", "--report-dir", str(folder / "report"),
            "--no-color",
        ]  # fmt: skip
        if max_time:
            command += ["--max-time", str(max_time)]
        t0 = time.monotonic()
        out = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=3600)
        seconds = time.monotonic() - t0
        reports = sorted((folder / "report").glob("*.json"))
        if not reports:
            raise RuntimeError(f"schemathesis wrote no report:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
        figures = summarize(json.loads(reports[-1].read_text()))
        figures["seconds"] = round(seconds, 1)
        figures["output_tail"] = out.stdout[-6000:]
        return figures
    finally:
        if web is not None:
            stop_group(web)
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=50, help="test cases per operation and phase")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-time", type=int, default=None, help="a time budget in seconds for the run")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="myriad-fuzz-") as tmp:
        figures = run_fuzz(
            Path(tmp), max_examples=args.max_examples, seed=args.seed, max_time=args.max_time,
            workers=args.workers,
        )  # fmt: skip
    tail = figures.pop("output_tail")
    if figures["failures"]:
        print(tail)
    print(f"{'operations tested':<24}{figures['operations']:>10}")
    print(f"{'test cases':<24}{figures['test_cases']:>10}")
    print(f"{'server errors (5xx)':<24}{figures['server_errors']:>10}")
    print(f"{'schema violations':<24}{figures['schema_violations']:>10}")
    print(f"{'failures of any kind':<24}{figures['failures']:>10}")
    print(f"{'seconds':<24}{figures['seconds']:>10}")
    print("phases: " + ", ".join(f"{k} {v}" for k, v in figures["phases"].items()))
    print(json.dumps({k: v for k, v in figures.items() if k not in ("phases", "failing_operations")}))


if __name__ == "__main__":
    main()
