"""Soak: four cycle workers at once on PostgreSQL for 10,000 cycles while jobs are submitted,
cancelled, faulted and finished throughout; the invariant checker reads the database after every
100 cycles.

Each worker is its own process running the scheduling cycle task's body (the request marker
cleared, then ``run_cycle`` under the scheduling lock) in a loop, as four Celery workers would. A
churn process beside them acts as tenants, nodes and operators through the same service
functions the API calls: submits (rigid, elastic and shared-GPU jobs), cancels of pending and
running jobs, finishes, XID faults that restart a job in place and node faults that take a node
down, handled under the lock, with the node repaired and returned later. After every 100 cycles
``scheduling.invariants.check_database`` counts GPUs held beyond their capacity (double
allocations), quota rules broken, active allocations of jobs that are not running, and running
jobs that hold nothing.

    python -m bench.soak [--cycles 10000] [--workers 4] [--cluster demo] [--seed 1]

Needs PostgreSQL at MYRIAD_BENCH_PG (default postgres://postgres@127.0.0.1:5432); the database
``myriad_soak`` (``--database``) is dropped and created.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from bench._backends import PG_BASE

DB_NAME = "myriad_soak"
BACKLOG = 300
COUNTS = ("submitted", "cancelled", "finished", "faults", "node_faults", "returned")


def _environment(data_dir: Path, database: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MYRIAD_REDIS_URL"}
    env.update(
        MYRIAD_DATABASE_URL=f"{PG_BASE}/{database}",
        MYRIAD_DATA_DIR=str(data_dir),
        DJANGO_SETTINGS_MODULE="config.settings",
        MYRIAD_LOG_LEVEL="WARNING",
        # the four workers run cycles back to back on purpose (they contend for the lock): no
        # minimum interval between cycles
        MYRIAD_CYCLE_MIN_INTERVAL_S="0",
    )
    return env


def _setup_database(env: dict, cluster: str, database: str) -> None:
    import psycopg

    from tests.browser_stack import manage

    with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    manage(env, "migrate", "--noinput")
    manage(env, "build_cluster", cluster)
    manage(env, "seed_queues")


def _worker(env: dict, done, total: int, errors) -> None:
    """One cycle worker: the cycle task's body until ``total`` cycles ran across all workers."""
    os.environ.update(env)
    import django

    django.setup()
    from scheduling.tasks import run_scheduling_cycle

    while True:
        with done.get_lock():
            if done.value >= total:
                return
        try:
            run_scheduling_cycle()
        except Exception as exc:  # noqa: BLE001 - counted and shown: a soak must not stop at one
            with errors.get_lock():
                errors.value += 1
            print(f"cycle failed: {exc!r}", file=sys.stderr)
        with done.get_lock():
            done.value += 1


class Churn:
    """Tenants, nodes and operators acting through the service layer, seeded."""

    def __init__(self, seed: int) -> None:
        from scheduling.models import Queue

        self.rng = random.Random(seed)
        self.queues = list(Queue.objects.filter(stopped=False).order_by("name"))
        self.counts = dict.fromkeys(COUNTS, 0)
        self.down: list[tuple[float, int]] = []  # (when to repair and return, node id)
        self.steps, self.backlogged = 0, False

    def step(self) -> None:
        self.steps += 1
        if self.steps % 50 == 1:  # a backlog held near BACKLOG pending jobs: a steady state, not a pile
            from scheduling.models import Job

            self.backlogged = Job.objects.filter(state="pending").count() > BACKLOG
            self.repair_the_rest()
        weights = (0 if self.backlogged else 10, 2, 5, 2, 0.3)
        action = self.rng.choices(("submit", "cancel", "finish", "fault", "node_fault"), weights=weights)[0]
        getattr(self, action)()
        self.return_nodes()

    def submit(self) -> None:
        from scheduling.services import SubmitError, submit_job

        kind = self.rng.random()
        fields = {"queue": self.rng.choice(self.queues), "topology": "any"}
        if kind < 0.15:  # elastic
            fields.update(gpus=self.rng.choice((8, 16, 32)), min_gpus=4, size_step=4)
        elif kind < 0.25:  # a share of one GPU
            fields.update(gpus=1, share=self.rng.choice((250, 500)))
        else:
            fields.update(gpus=self.rng.choice((1, 2, 4, 8, 8, 16, 32, 64)))
        try:
            submit_job(**fields)
            self.counts["submitted"] += 1
        except SubmitError:
            pass

    def _some_job(self, states):
        from scheduling.models import Job

        ids = list(Job.objects.filter(state__in=states).order_by("-id").values_list("id", flat=True)[:200])
        return self.rng.choice(ids) if ids else None

    def cancel(self) -> None:
        self._act(("pending", "running"), "cancel", "cancelled")

    def finish(self) -> None:
        self._act(("running",), "finish", "finished")

    def _act(self, states, action: str, counter: str) -> None:
        from engine.states import InvalidTransition
        from scheduling.services import change_state

        job_id = self._some_job(states)
        if job_id is None:
            return
        try:
            change_state(job_id, action, actor="soak")
            self.counts[counter] += 1
        except InvalidTransition:  # a cycle or a fault moved it first
            pass

    def _gpu_of_running_job(self):
        from scheduling.models import AllocatedGPU

        job_id = self._some_job(("running",))
        if job_id is None:
            return None
        return (
            AllocatedGPU.objects.filter(job_id=job_id, active=True).values_list("gpu_id", flat=True).first()
        )

    def fault(self, xid: int = 43, counter: str = "faults"):
        from cluster.models import GPU
        from monitoring.faults.services import handle_fault, report_fault

        gpu_id = self._gpu_of_running_job()
        if gpu_id is None:
            return None
        fault = report_fault(source="xid", xid=xid, gpu=GPU.objects.get(pk=gpu_id))
        handle_fault(fault.pk)  # the fault task's body, at once (no Celery worker here)
        self.counts[counter] += 1
        return gpu_id

    def node_fault(self) -> None:
        from cluster.models import GPU

        gpu_id = self.fault(xid=79, counter="node_faults")  # fallen off the bus: the node reboots
        if gpu_id is not None:
            node_id = GPU.objects.values_list("node_id", flat=True).get(pk=gpu_id)
            self.down.append((time.monotonic() + self.rng.uniform(2, 10), node_id))

    def repair_the_rest(self) -> None:
        """Nodes the fault handling took down on its own (repeated XIDs on one node escalate) are
        repaired too, a few seconds later, as a repair crew would: the cluster does not shrink."""
        from cluster.models import Node

        waiting = {n for _, n in self.down}
        for node_id in Node.objects.filter(state__in=("down", "drained")).values_list("id", flat=True):
            if node_id not in waiting:
                self.down.append((time.monotonic() + self.rng.uniform(2, 10), node_id))

    def return_nodes(self) -> None:
        from cluster.models import Node
        from cluster.services import apply_node_action
        from engine.states import InvalidTransition

        due = [n for t, n in self.down if t <= time.monotonic()]
        self.down = [(t, n) for t, n in self.down if t > time.monotonic()]
        for node_id in due:
            node = Node.objects.get(pk=node_id)
            try:
                if node.state in ("down", "drained"):
                    apply_node_action([node], "repair", actor="soak")
                    node.refresh_from_db()
                if node.state == "repairing":
                    apply_node_action([node], "return", actor="soak")
                    self.counts["returned"] += 1
            except InvalidTransition:
                pass


class Tally:
    """What the invariant checks found, over the whole run."""

    def __init__(self) -> None:
        self.checks = self.double = self.quota = self.other = 0
        self.problems: list[str] = []

    def add(self, report, when: str) -> None:
        self.checks += 1
        self.double += report.double_allocations
        self.quota += len(report.quota_violations)
        self.other += report.orphan_allocations + report.running_without_gpus + report.resurrected
        self.problems += [f"{when}: {p}" for p in report.problems]

    def figures(self) -> dict:
        return {
            "checks": self.checks,
            "double_allocations": self.double,
            "quota_violations": self.quota,
            "other_violations": self.other,
            "problems": self.problems[:20],
        }


def soak(
    cycles: int, workers: int, cluster: str, seed: int, check_every: int = 100, database: str = DB_NAME
) -> dict:
    data_dir = Path(tempfile.mkdtemp(prefix="myriad-soak-"))
    env = _environment(data_dir, database)
    _setup_database(env, cluster, database)
    os.environ.update(env)
    import django

    django.setup()
    from scheduling.invariants import check_database

    ctx = mp.get_context("spawn")
    done, errors = ctx.Value("l", 0), ctx.Value("l", 0)
    churn = Churn(seed)
    procs = [ctx.Process(target=_worker, args=(env, done, cycles, errors)) for _ in range(workers)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    tally = Tally()
    next_check = check_every
    while any(p.is_alive() for p in procs):
        churn.step()
        if done.value >= next_check:
            tally.add(check_database(), f"after {done.value} cycles")
            if tally.checks % 10 == 0:
                print(f"{done.value} cycles, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
            next_check = (done.value // check_every + 1) * check_every
        time.sleep(0.002)
    for p in procs:
        p.join()
    seconds = time.monotonic() - t0
    tally.add(check_database(), "at the end")
    from cluster.models import Node
    from scheduling.models import Job

    states = {s: Job.objects.filter(state=s).count() for s in ("pending", "running", "finished", "cancelled")}
    return {
        "cycles": done.value,
        "workers": workers,
        "seconds": round(seconds, 1),
        "cycles_per_s": round(done.value / seconds, 1),
        "failed_cycles": errors.value,
        **tally.figures(),
        **churn.counts,
        "jobs_by_state": states,
        "nodes_ready_at_end": Node.objects.filter(state="ready").count(),
        "nodes": Node.objects.count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--cluster", default="demo")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database", default=DB_NAME, help="the PostgreSQL database to drop and create")
    args = parser.parse_args()
    figures = soak(args.cycles, args.workers, args.cluster, args.seed, database=args.database)
    for key in ("cycles", "workers", "seconds", "cycles_per_s", "failed_cycles", "checks"):
        print(f"{key:<24}{figures[key]:>12}")
    for key in ("double_allocations", "quota_violations", "other_violations"):
        print(f"{key:<24}{figures[key]:>12}")
    for key in COUNTS:
        print(f"{key:<24}{figures[key]:>12}")
    print("jobs at the end: " + ", ".join(f"{k} {v}" for k, v in figures["jobs_by_state"].items()))
    for line in figures["problems"]:
        print("  " + line)
    print(json.dumps({k: v for k, v in figures.items() if k != "problems"}))


if __name__ == "__main__":
    main()
