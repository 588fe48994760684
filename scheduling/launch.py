"""Jobs on real nodes: what each node's agent runs, and how its reports move the job.

A running job with a ``command`` is started by the agents of the nodes it holds GPUs on, once per
node, with the environment a distributed launcher expects. Its *generation* names one placement
(its run's start and the GPUs it holds): when a recovery, a shrink or a new admission changes the
placement, the generation changes and every agent restarts the command for the new one; a job no
longer assigned to a node is stopped there (SIGTERM, then SIGKILL after the grace period).

The job counts as started when every node reports its process running for the current generation
(the ``launched`` event). A node that does not within LAUNCH_READY_TIMEOUT_S (Kueue's
waitForPodsReady) gets the job stopped everywhere and requeued with exponential backoff (base 60 s,
at most an hour, as Kueue's requeuingStrategy), the nodes that failed to start named; after
LAUNCH_FAILURE_LIMIT failed starts in a row the job fails. Exit codes decide the end: every rank
exiting 0 finishes the job, any non-zero exit fails it with the code and the last lines of output.
After a fault the recovery's steps are measured from these reports, not modelled.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from cluster.audit import record
from cluster.models import GPU, Node, NodeCredential
from engine import tiers
from engine.lifecycle import JobStateError, saves_on_demand
from scheduling.choices import EventKind, JobState, ProcessState
from scheduling.locks import locked_transaction
from scheduling.models import AllocatedGPU, Allocation, Job, JobEvent, JobProcess
from scheduling.services import change_state, requeue
from scheduling.store import allocations
from scheduling.trigger import assignments_changed, request_cycle

# sent when every node of a launched job runs its current placement: job, placement, at
job_launched = Signal()
BACKOFF_BASE_S = 60.0
BACKOFF_MAX_S = 3600.0
# variables the platform sets for every launch; a job's own env may not override them
LAUNCH_VARIABLES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "NODE_RANK",
        "GROUP_RANK",
        "NNODES",
        "LOCAL_WORLD_SIZE",
        "CUDA_VISIBLE_DEVICES",
        "MYRIAD_JOB_ID",
        "MYRIAD_ARRAY_ID",
        "MYRIAD_ARRAY_INDEX",
        "MYRIAD_GENERATION",
        "MYRIAD_CHECKPOINT_DIR",
        "MYRIAD_CHECKPOINT_REPORT",
        "MYRIAD_PROGRESS_FILE",
        "MYRIAD_ASSIGNMENT_FILE",
    }
)


@dataclass
class Placement:
    """Where one launched job runs now: its nodes in rank order with their GPUs on each."""

    job_id: int
    generation: str
    since: datetime  # when this placement began (the newest of its allocations)
    nodes: list[int] = field(default_factory=list)
    slots: dict[int, list[int]] = field(default_factory=dict)  # node id -> GPU indices on the node

    @property
    def world_size(self) -> int:
        return sum(len(s) for s in self.slots.values())

    def rank_of(self, node_id: int) -> int:
        return self.nodes.index(node_id)

    @property
    def master_port(self) -> int:
        return 20000 + int(self.generation, 16) % 20000


def generation_of(started_at: datetime | None, gpu_ids) -> str:
    text = f"{started_at.timestamp() if started_at else 0:.6f}:{','.join(map(str, sorted(gpu_ids)))}"
    return f"{zlib.crc32(text.encode()):08x}"


def placements(job_ids) -> dict[int, Placement]:
    """The current placement of each running launched job of ``job_ids`` (two queries)."""
    rows = (
        AllocatedGPU.objects.filter(job_id__in=list(job_ids), active=True, job__state=JobState.RUNNING)
        .exclude(job__command="")
        .values_list("job_id", "gpu_id", "node_id", "index", "created_at", "job__started_at")
        .order_by("job_id", "node_id", "index")
    )
    found: dict[int, Placement] = {}
    gpus: dict[int, list[int]] = {}
    started: dict[int, datetime | None] = {}
    for job_id, gpu_id, node_id, index, created, started_at in rows:
        p = found.get(job_id)
        if p is None:
            p = found[job_id] = Placement(job_id, "", created)
            started[job_id] = started_at
        p.since = max(p.since, created, *([started_at] if started_at else []))
        if node_id not in p.slots:
            p.nodes.append(node_id)
            p.slots[node_id] = []
        p.slots[node_id].append(index)
        gpus.setdefault(job_id, []).append(gpu_id)
    for job_id, p in found.items():
        p.generation = generation_of(started[job_id], gpus[job_id])
    return found


def _node_jobs(node_id: int) -> list[int]:
    return list(
        Allocation.objects.filter(node_id=node_id, active=True, job__state=JobState.RUNNING)
        .exclude(job__command="")
        .values_list("job_id", flat=True)
        .distinct()
    )


def assignments(node: Node) -> list[dict]:
    """What the node's agent must run now: one entry per launched job holding GPUs on it."""
    job_ids = _node_jobs(node.pk)
    if not job_ids:
        return []
    found = placements(job_ids)
    all_nodes = {n for p in found.values() for n in p.nodes}
    addresses = dict(
        NodeCredential.objects.filter(node_id__in=all_nodes, revoked_at__isnull=True).values_list(
            "node_id", "address"
        )
    )
    hostnames = dict(Node.objects.filter(pk__in=all_nodes).values_list("pk", "hostname"))
    jobs = Job.objects.filter(pk__in=list(found)).select_related(
        "checkpoint_policy", "queue__default_checkpoint_policy"
    )
    out = []
    for job in jobs:
        p = found[job.pk]
        rank, slots, master = p.rank_of(node.pk), p.slots[node.pk], p.nodes[0]
        env = {str(k): str(v) for k, v in (job.env or {}).items()}
        env.update(
            MASTER_ADDR=addresses.get(master) or hostnames[master],
            MASTER_PORT=str(p.master_port),
            WORLD_SIZE=str(p.world_size),
            NNODES=str(len(p.nodes)),
            NODE_RANK=str(rank),
            GROUP_RANK=str(rank),
            RANK=str(rank),
            LOCAL_WORLD_SIZE=str(len(slots)),
            CUDA_VISIBLE_DEVICES=",".join(map(str, slots)),
            MYRIAD_JOB_ID=str(job.pk),
            MYRIAD_GENERATION=p.generation,
        )
        if job.array_id is not None:  # one job of an array: which one (Slurm's SLURM_ARRAY_TASK_ID)
            env.update(MYRIAD_ARRAY_ID=str(job.array_id), MYRIAD_ARRAY_INDEX=str(job.array_index))
        requested = job.checkpoint_requested_at
        out.append(
            {
                "job": job.pk,
                "generation": p.generation,
                "command": job.command,
                "env": env,
                "gpus": slots,
                "rank": rank,
                "nnodes": len(p.nodes),
                "checkpoint_requested_at": requested.timestamp() if requested else None,
                "warm": _warm(job),
                "save_on_stop": _saves_on_demand(job),
            }
        )
    return sorted(out, key=lambda a: a["job"])


def _warm(job: Job) -> bool:
    """Whether the job's recovery tier keeps healthy nodes' processes when its placement changes."""
    policy = job.effective_checkpoint_policy
    return bool(policy) and tiers.has(policy.recovery_tier, tiers.RecoveryTier.WARM_RESTART)


def _saves_on_demand(job: Job) -> bool:
    """Whether the job's policy saves when asked (triggered): its ranks get the checkpoint signal
    before they are stopped, wherever the stop comes from (a fault, a preemption, a drain)."""
    policy = job.effective_checkpoint_policy
    return bool(policy) and saves_on_demand(policy.kind)


def env_problem(env: dict) -> str | None:
    """Why a job's extra environment cannot be used, or None."""
    if len(env) > 200:
        return f"{len(env)} variables; at most 200"
    for name in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name):
            return f"{name!r} is not a variable name"
        if name in LAUNCH_VARIABLES:
            return f"{name} is set by the platform for each node; leave it out"
    return None


@transaction.atomic
def request_checkpoint(job_id: int, *, actor: str, reason: str = "") -> Job:
    """Ask a running launched job to save now; its agents signal it (audited)."""

    job = Job.objects.select_for_update().get(pk=job_id)
    if job.state != JobState.RUNNING or not job.command:
        raise JobStateError(
            f"only a running job started by node agents can be asked to save; this one is {job.state}"
            + ("" if job.command else " and has no command")
        )
    before = job.checkpoint_requested_at
    job.checkpoint_requested_at = timezone.now()
    job.save(update_fields=["checkpoint_requested_at"])
    record(
        actor,
        "request checkpoint",
        "job",
        job,
        {
            "checkpoint_requested_at": [
                before.isoformat() if before else None,
                job.checkpoint_requested_at.isoformat(),
            ]
        },
        reason,
    )
    assignments_changed()
    return job


# --- the agents' process reports -------------------------------------------------------------


def record_processes(node: Node, processes: list[dict], now: datetime) -> None:
    """Store each reported process state (validated by monitoring.telemetry.ingest) and settle the jobs."""
    if not processes:
        return
    # the jobs' rows first, in id order: two nodes reporting the same job at once take turns, so
    # the second sees the first's process and the job is launched (else each would see the other
    # still starting and neither would launch it)
    list(
        Job.objects.select_for_update()
        .filter(pk__in={r["job"] for r in processes})
        .order_by("pk")
        .values("pk")
    )
    existing = {
        (p.job_id, p.generation): p
        for p in JobProcess.objects.filter(
            node=node,
            job_id__in={r["job"] for r in processes},
            generation__in={r["generation"] for r in processes},
        )
    }
    found = placements({r["job"] for r in processes})
    for r in processes:
        key = (r["job"], r["generation"])
        row = existing.get(key)
        if row is None and r.get("adopted_from"):  # warm restart: the same process, a new placement
            row = JobProcess.objects.filter(job_id=r["job"], node=node, generation=r["adopted_from"]).first()
            if row is not None:
                p = found.get(r["job"])
                row.generation = r["generation"]
                row.rank = (
                    p.rank_of(node.pk) if p and p.generation == r["generation"] and node.pk in p.nodes else 0
                )
                existing[key] = row
        if row is None:
            p = found.get(r["job"])
            rank = p.rank_of(node.pk) if p and p.generation == r["generation"] and node.pk in p.nodes else 0
            row = existing[key] = JobProcess(
                job_id=r["job"], node=node, generation=r["generation"], rank=rank
            )
        row.state = r["state"]
        row.pid = r.get("pid") or row.pid
        row.exit_code = r.get("exit_code")
        if r.get("started_at"):
            row.started_at = agent_time(r["started_at"], now)
        if r.get("ended_at"):
            row.ended_at = agent_time(r["ended_at"], now)
        if r.get("log_tail") is not None:
            row.log_tail = r["log_tail"][-settings.LAUNCH_LOG_TAIL_CHARS :]
        row.save()
    for job_id in sorted({r["job"] for r in processes}):
        if job_id in found:
            _settle(found[job_id], node, now)


def agent_time(epoch: float, now: datetime) -> datetime:
    """An agent's timestamp, never in the future of the control plane's clock."""
    return min(datetime.fromtimestamp(epoch, tz=now.tzinfo), now)


def _settle(p: Placement, reporter: Node, now: datetime) -> None:
    """Move the job by its current generation's processes: failed, finished, or running everywhere."""
    procs = list(JobProcess.objects.filter(job_id=p.job_id, generation=p.generation).select_related("node"))
    by_node = {x.node_id: x for x in procs if x.node_id in p.slots}
    failed = [x for x in by_node.values() if x.state == ProcessState.EXITED and x.exit_code not in (0, None)]
    if failed:
        x = failed[0]
        tail = "\n".join(x.log_tail.splitlines()[-5:])
        reason = f"exit code {x.exit_code} on {x.node.hostname} (rank {x.rank})" + (
            f"; last output:\n{tail}" if tail else ""
        )
        change_state(p.job_id, "fail", actor=f"node {x.node.hostname}", reason=reason[:2000], now=now)
        return
    started = {
        n
        for n, x in by_node.items()
        if x.state == ProcessState.RUNNING or (x.state == ProcessState.EXITED and x.exit_code == 0)
    }
    done = {n for n, x in by_node.items() if x.state == ProcessState.EXITED and x.exit_code == 0}
    if len(done) == len(p.nodes):
        change_state(
            p.job_id, "finish", actor=f"node {reporter.hostname}", reason="every rank exited 0", now=now
        )
        return
    if len(started) == len(p.nodes):
        _launched(p, now)


def _launched(p: Placement, now: datetime) -> None:
    job = Job.objects.select_for_update().get(pk=p.job_id)
    if job.launched_generation == p.generation or job.state != JobState.RUNNING:
        return
    job.launched_generation, job.start_failures = p.generation, 0
    job.save(update_fields=["launched_generation", "start_failures"])
    waited = (now - p.since).total_seconds()
    JobEvent.objects.create(
        job=job,
        kind=EventKind.LAUNCHED,
        at=now,
        reason=f"running on all {len(p.nodes)} nodes, {waited:.1f} s after placement",
        data={"generation": p.generation, "nodes": len(p.nodes), "start_s": round(waited, 3)},
    )
    job_launched.send(sender=Job, job=job, placement=p, at=now)  # monitoring measures a recovery


# --- starts that did not reach every node ------------------------------------------------------


def backoff_s(failures: int) -> float:
    return min(BACKOFF_BASE_S * 2 ** max(failures - 1, 0), BACKOFF_MAX_S)


def check_launches(now: datetime | None = None) -> list[int]:
    """Requeue (with backoff) or fail each launched job not running on every node within
    LAUNCH_READY_TIMEOUT_S of its placement; returns the jobs stopped."""
    now = now or timezone.now()
    timeout = timedelta(seconds=settings.LAUNCH_READY_TIMEOUT_S)
    waiting = list(
        Job.objects.filter(state=JobState.RUNNING, started_at__lte=now - timeout)
        .exclude(command="")
        .values_list("id", "launched_generation")
    )
    if not waiting:
        return []
    launched = dict(waiting)
    late = [
        p
        for p in placements(launched).values()
        if p.since <= now - timeout and p.generation != launched[p.job_id]
    ]
    stopped = []
    for p in late:
        with locked_transaction():
            if _give_up_start(p, now, timeout):
                stopped.append(p.job_id)
    return stopped


def _give_up_start(p: Placement, now: datetime, timeout: timedelta) -> bool:
    job = Job.objects.select_for_update().get(pk=p.job_id)
    if job.state != JobState.RUNNING or job.launched_generation == p.generation:
        return False
    running = set(
        JobProcess.objects.filter(job=job, generation=p.generation)
        .filter(state__in=(ProcessState.RUNNING, ProcessState.EXITED))
        .values_list("node_id", flat=True)
    )
    missing = [n for n in p.nodes if n not in running]
    hosts = dict(Node.objects.filter(pk__in=missing).values_list("pk", "hostname"))
    names = ", ".join(hosts[n] for n in missing)
    job.start_failures += 1
    limit = settings.LAUNCH_FAILURE_LIMIT
    what = (
        f"not running on every node {timeout.total_seconds():.0f} s after placement: {names} did not start it"
    )
    if job.start_failures >= limit:
        job.save(update_fields=["start_failures"])
        change_state(
            job.pk, "fail", actor="controller", reason=f"{what} ({limit} failed starts in a row)", now=now
        )
    else:
        wait = backoff_s(job.start_failures)
        allocations.release(now, job=job)
        fields = requeue(job, f"{what}; trying again after {wait:.0f} s")
        job.requeue_at = now + timedelta(seconds=wait)
        job.save(update_fields=[*fields, "start_failures", "requeue_at"])
        JobEvent.objects.create(
            job=job,
            kind=EventKind.REQUEUED,
            at=now,
            reason=f"{what}; requeued, trying again after {wait:.0f} s",
            data={
                "nodes_not_started": [hosts[n] for n in missing],
                "backoff_s": wait,
                "start_failures": job.start_failures,
            },
        )
        request_cycle()
        assignments_changed()  # a failed job's agents hear of it through change_state
    return True


def gpu_ids_by_index(node: Node) -> dict[int, int]:
    return dict(GPU.objects.filter(node=node).values_list("index", "id"))
