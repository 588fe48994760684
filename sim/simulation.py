"""What-if simulation of a whole cluster on a virtual clock (pure, seeded, in memory).

The production controller runs unchanged: every scheduling cycle is engine.scheduler.schedule over
the cluster's arrays (with its datacenter links and partitions), every fault is classified by
engine.faults and recovered by engine.recovery.plan_recovery, the invariant checker can run after
every cycle. Around it a discrete-event loop moves time: job arrivals, periodic scheduling cycles,
completions, faults drawn by the fleet model (sim.fleet), recovery, repairs and hourly samples.

Training progress is accounted in GPU-seconds of work. A running job checkpoints every tau
seconds of productive time (its policy: periodic synchronous with a stall of state size over
storage bandwidth, asynchronous with a short copy to host memory, or triggered with an
asynchronous fallback; tau fixed or Daly's optimum for the job's fault rate); a fault loses the
work since the last checkpoint (none when a triggered save succeeds), costs the detection latency
and a restart (reschedule, process start, communicator initialization, checkpoint load). A
preempted job keeps what its policy could save, as in production. Each job's time is split into
productive time and the loss buckets of the ETTR definition.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from engine.checkpoint import CheckpointKind
from engine.ettr import Ettr
from engine.inference import LoadProfile
from engine.invariants import check_cycle
from engine.lifecycle import Verdict, checkpoint_bytes, judge, saves_on_demand, unsaved_s
from engine.network import Network, model_for
from engine.placement import Layout
from engine.recovery import plan_recovery
from engine.scheduler import schedule
from engine.sites import SPANNING, SiteLinks
from engine.states import (
    NODE_STATE_CODE,
    InvalidTransition,
    gpu_event_code,
    node_event_code,
)
from engine.topology import TopologySnapshot
from engine.workload import PendingJob, QueueSpec, RunningJob
from sim.autoscale import AUTOSCALE_S, autoscale
from sim.config import SimConfig, default_queues, job_timing
from sim.fleet import Fleet
from sim.sites import SiteBook
from sim.summary import summarize, take_sample
from sim.workload import SimJob, SimService

DAY = 86_400.0
READY = NODE_STATE_CODE["ready"]


@dataclass
class _Job:
    spec: SimJob
    remaining: float  # GPU-seconds of work still to do
    held: np.ndarray | None = None  # the GPU indices it runs on (None: not running)
    run_start: float = 0.0  # productive work starts here (after restart overheads)
    interval: float = 3600.0
    stall_fraction: float = 0.0
    overhead: float = 0.0  # share of time given to the replica groups' quorum (degraded)
    rollback: float = 3600.0  # a fault rolls back to a multiple of this (engine.tiers)
    step_s: float = 1.0
    version: int = 0
    first_admit: float | None = None
    waiting_since: float | None = None
    ended: float | None = None
    ettr: Ettr = field(default_factory=Ettr)  # its loss buckets (the wall time is set at the summary)
    interruptions: int = 0

    @property
    def size(self) -> int:
        return len(self.held) if self.held is not None else 0


def as_pending(job: _Job) -> PendingJob:
    """The job as the scheduler sees it pending: asking for what it still has to do."""
    spec = job.spec
    return PendingJob(
        spec.id,
        spec.queue,
        spec.gpus,
        spec.priority,
        (spec.chip,),
        spec.topology,
        spec.arrival,
        job.remaining / spec.gpus,
        spec.min_gpus,
        spec.size_step,
        model=model_for(spec.parameters) if spec.topology in SPANNING and spec.parameters else None,
    )


class Simulation:
    def __init__(
        self,
        topo: TopologySnapshot,
        jobs: list[SimJob],
        config: SimConfig | None = None,
        queues: list[QueueSpec] | None = None,
        datacenter_links: dict[tuple[int, int], float] | None = None,
        services: list[SimService] | None = None,
        site_links: SiteLinks | None = None,
    ):
        self.cfg = config or SimConfig()
        # the simulation changes states: work on copies of the state arrays
        self.topo = replace(topo, gpu_state=topo.gpu_state.copy(), node_state=topo.node_state.copy())
        self.layout = Layout(self.topo)
        self.ph = self.cfg.physics
        self.fleet = Fleet(self.topo, self.ph, self.cfg.fleet, seed=self.cfg.seed)
        self.network = Network(self.topo, datacenter_links=datacenter_links)
        self.sites = SiteBook(site_links, self.cfg.partitions, self.topo)  # links, partitions, shares
        self.net_rng = np.random.default_rng([self.cfg.seed, 5])
        capacity = {c: n for c, n in self.topo.count_by_chip().items() if n}
        self.services = list(services or [])
        inference: dict[str, int] = {}
        for svc in self.services:
            inference[svc.chip] = inference.get(svc.chip, 0) + svc.max_replicas * svc.replica_gpus
        self.queues = queues or default_queues(capacity, inference)
        self.profiles = [LoadProfile.from_dict(svc.load_profile()) for svc in self.services]
        self.replicas: list[list[int]] = [[] for _ in self.services]  # job ids, oldest first
        self.low_since: list[float | None] = [None] * len(self.services)
        self.replica_seconds = [0.0] * len(self.services)
        self.short_seconds = [0.0] * len(self.services)  # running replicas below what the load needs
        self._next_id = max((j.id for j in jobs), default=0) + 1
        self.jobs = {j.id: _Job(j, j.work_s * j.gpus) for j in jobs}
        self.pending: dict[int, PendingJob] = {}
        self.running: dict[int, _Job] = {}
        self.owner = np.full(self.topo.num_gpus, -1, dtype=np.int64)
        self.events: list[tuple[float, int, str, tuple]] = []
        self._seq = 0
        self.luck = np.random.default_rng([self.cfg.seed, 3])
        self.now, self.dirty = 0.0, True
        self.fault_history: dict[int, list[tuple[float, str, int | None]]] = {}  # (t, source, xid)
        self.quarantined: set[int] = set()  # lemon nodes: out until an operator clears them
        self.faults: Counter = Counter()
        self.fault_log: list[tuple[float, str, str]] = []  # (time, cause, action)
        self.recoveries: list[tuple[float, str, float]] = []  # (time, outcome, seconds)
        self.samples: list[dict] = []
        self._views: dict[int, tuple[tuple, RunningJob]] = {}
        self.cycles = self.checked = self.processed = 0

    # --- the event loop -----------------------------------------------------------------------
    def _push(self, t: float, kind: str, *payload) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, payload))

    def run(self, progress=None) -> dict:
        started = time.perf_counter()
        end = self.cfg.days * DAY
        for job in self.jobs.values():
            if job.spec.arrival <= end:
                self._push(job.spec.arrival, "arrive", job.spec.id)
        self._push(0.0, "cycle")
        self._push(0.0, "sample")
        if self.services:
            self._push(0.0, "autoscale")
        self._next_fault()
        last_report = 0.0
        while self.events and self.events[0][0] <= end:
            t, _, kind, payload = heapq.heappop(self.events)
            self.now = t
            self.processed += 1
            getattr(self, f"_on_{kind}")(*payload)
            if progress is not None and t - last_report >= DAY / 4 and t < end:
                progress(t / end)
                last_report = t
        self.now = end
        if progress is not None:
            progress(1.0)
        return summarize(self, time.perf_counter() - started)

    # --- arrivals and cycles --------------------------------------------------------------------
    def _queue(self, job: _Job) -> None:
        self.pending[job.spec.id] = as_pending(job)

    def new_job_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def submit(self, spec: SimJob) -> None:
        """A job submitted now (an inference replica the autoscaler adds): it arrives at once."""
        self.jobs[spec.id] = _Job(spec, spec.work_s * spec.gpus)
        self._on_arrive(spec.id)

    def retire(self, job_id: int) -> None:
        """A job ends now by the controller's choice (a replica scaled away): a running one stops
        with a save, a pending one leaves the queue."""
        job = self.jobs[job_id]
        if job_id in self.pending:
            del self.pending[job_id]
        elif job_id in self.running:
            self._stop(job, graceful=True, requeue=False)
        job.ended = self.now

    def _on_arrive(self, job_id: int) -> None:
        self._queue(self.jobs[job_id])
        self.dirty = True

    def arrive_and_schedule(self, *job_ids: int) -> None:
        """Scripted what-ifs: these jobs arrive now and one scheduling cycle runs at once."""
        for job_id in job_ids:
            self._on_arrive(job_id)
        self.dirty = True
        self._on_cycle()

    def _running_view(self) -> list[RunningJob]:
        """The running jobs as the scheduler sees them; a job's view is rebuilt only when it
        changed (a new run, or a new checkpoint since the last cycle)."""
        view = []
        for job in self.running.values():
            spec = job.spec
            elapsed = max(0.0, self.now - job.run_start)
            checkpoints = math.floor(elapsed / job.interval)
            key = (job.version, checkpoints)
            cached = self._views.get(spec.id)
            if cached is not None and cached[0] == key:
                view.append(cached[1])
                continue
            last = job.run_start + checkpoints * job.interval
            end = self._finish_time(job)
            view.append(
                RunningJob(
                    spec.id,
                    spec.queue,
                    job.held,
                    spec.chip,
                    spec.priority,
                    job.first_admit or self.now,
                    end,
                    last if elapsed >= job.interval else None,
                    min_gpus=spec.min_gpus,
                    max_gpus=spec.gpus if spec.min_gpus is not None else None,
                    size_step=spec.size_step,
                    topology=spec.topology,
                )
            )
            self._views[spec.id] = (key, view[-1])
        return view

    def _on_cycle(self) -> None:
        self._push(self.now + self.cfg.cycle_period_s, "cycle")
        if not self.dirty or not self.pending:
            return
        self.dirty = False
        self.cycles += 1
        running = self._running_view()
        pending = list(self.pending.values())
        sites = self.sites.for_cycle(self.now)
        result = schedule(self.layout, self.queues, running, pending, self.now, self.cfg.scheduler, **sites)
        self.sites.decisions_s += result.span_decisions_s
        if self.cfg.check_invariants:
            check_cycle(self.layout, self.queues, running, pending, result, self.now)
            self.checked += 1
        for p in result.preemptions:
            self._stop(self.running[p.job_id], graceful=True, requeue=True)
        for r in result.resizes:
            job = self.running[r.job_id]
            self._save(job, graceful=True)
            self.owner[job.held] = -1
            self._start(job, r.held, resumed=True)
        for a in result.admissions:
            job = self.jobs[a.job_id]
            del self.pending[a.job_id]
            self.sites.admitted(a, self.now)
            self._start(job, a.held, resumed=job.first_admit is not None, slowdown=a.span_slowdown)

    # --- running, saving, stopping ------------------------------------------------------------
    def _policy(self, job: _Job) -> None:
        """Checkpoint interval, stall, rollback and overhead for the job at its size."""
        t = job_timing(self.cfg.checkpoint, job.spec.parameters, job.size, self.ph)
        job.interval, job.stall_fraction, job.step_s = t.interval, t.stall_fraction, t.step_s
        job.rollback, job.overhead = t.rollback, t.overhead

    def _start(self, job: _Job, held: np.ndarray, *, resumed: bool, slowdown: float = 0.0) -> None:
        size = len(held)
        job.held = np.asarray(held, dtype=np.int64)
        self.owner[job.held] = job.spec.id
        self._policy(job)
        job.overhead += slowdown / (1 + slowdown)  # across datacenters its steps are slower
        overhead = self.ph.process_start_s + self.ph.comm_init_s(size)
        if resumed:
            state = checkpoint_bytes(job.spec.parameters, self.ph)
            overhead += self.ph.reschedule_s + state / (self.ph.storage_gbps(size) * 1e9)
        if job.first_admit is None:
            job.first_admit = self.now
        if job.waiting_since is not None:
            job.ettr.add("waiting", self.now - job.waiting_since)
            job.waiting_since = None
        job.ettr.add("restart", overhead)
        job.run_start = self.now + overhead
        job.version += 1
        self.running[job.spec.id] = job
        self._schedule_end(job)

    def _schedule_end(self, job: _Job) -> None:
        """The job ends when its remaining work is done at its size, less checkpoint stalls; an
        end event of an older run (older version) is ignored."""
        self._push(self._finish_time(job), "end", job.spec.id, job.version)

    @staticmethod
    def _finish_time(job: _Job) -> float:
        return job.run_start + job.remaining / job.size / max(1e-9, 1 - job.stall_fraction - job.overhead)

    def _save(self, job: _Job, *, graceful: bool, at: float | None = None) -> float:
        """Account the run so far; returns the GPU-seconds lost. Graceful: the policy can save now."""
        at = self.now if at is None else at
        elapsed = max(0.0, at - job.run_start)
        keep = 1 - job.stall_fraction - job.overhead
        done = elapsed * keep * job.size
        saves = graceful and saves_on_demand(self.cfg.checkpoint.kind)
        lost = 0.0 if saves else unsaved_s(at, job.run_start, None, every=job.rollback) * keep * job.size
        job.ettr.add("checkpoint_stall", elapsed * job.stall_fraction)
        job.ettr.add("degraded", elapsed * job.overhead)
        job.ettr.add("lost_work", lost / job.size)
        job.remaining = max(0.0, job.remaining - (done - lost))
        job.run_start = at
        return lost

    def _stop(self, job: _Job, *, graceful: bool, requeue: bool) -> None:
        self._save(job, graceful=graceful)
        self.owner[job.held] = -1
        job.version += 1
        del self.running[job.spec.id]
        self.sites.stopped(job.spec.id, self.now)
        job.held = None
        if requeue:
            job.waiting_since = self.now
            self._queue(job)
        self.dirty = True

    def _on_end(self, job_id: int, version: int) -> None:
        job = self.running.get(job_id)
        if job is None or job.version != version:
            return  # preempted, resized or recovered since: a newer end event stands
        elapsed = max(0.0, self.now - job.run_start)
        job.ettr.add("checkpoint_stall", elapsed * job.stall_fraction)
        job.ettr.add("degraded", elapsed * job.overhead)
        job.remaining = 0.0
        self.owner[job.held] = -1
        del self.running[job_id]
        self.sites.stopped(job_id, self.now)
        job.ended = self.now
        self.dirty = True

    # --- inference services -------------------------------------------------------------------
    def _on_autoscale(self) -> None:
        self._push(self.now + AUTOSCALE_S, "autoscale")
        autoscale(self)

    # --- faults and repairs --------------------------------------------------------------------
    def _next_fault(self) -> None:
        drawn = self.fleet.next_fault(self.now, self.topo.node_state == READY)
        if drawn is not None:
            self._push(drawn[0], "fault", drawn[1], drawn[2])

    def _on_fault(self, node: int, cause: str) -> None:
        self._next_fault()
        self.inject_fault(node, cause)

    def inject_fault(self, node: int, cause: str) -> Verdict:
        """A fault of ``cause`` (a key of the physics' causes) on node index ``node`` now, handled
        as the production fault task handles a reported one (scripted what-ifs call this)."""
        _, source, xid = self.ph.causes[cause]
        return self.inject(node, source, xid, cause=cause)

    def inject(self, node: int, source: str, xid: int | None = None, *, cause: str | None = None) -> Verdict:
        """A fault of ``source`` (and ``xid``) on node index ``node`` now: judged by the fault
        verdict (engine.lifecycle.judge), applied to the hardware through the state tables, and
        every job it interrupts recovered as production recovers it."""
        history = self.fault_history.setdefault(node, [])
        v = judge(history, self.now, source, xid)
        history.append((self.now, source, xid))
        c = v.classification
        self.faults[cause or c.cause] += 1
        self.fault_log.append((self.now, cause or c.cause, c.action.value))
        lay = self.layout
        start, count = int(lay.node_gpu_start[node]), int(lay.node_gpu_count[node])
        node_gpus = np.arange(start, start + count)
        faulty = self._take_out(node, node_gpus, v)
        self.fleet.ecc[node_gpus] += 1
        self.dirty = True
        if not v.interrupts_job:
            return v
        hit = {int(j) for j in self.owner[node_gpus] if j >= 0}
        if cause == "network":
            # a switch or link fault on the rack's uplink: every job crossing it is interrupted
            rack = int(self.topo.node_rack[node])
            crossing = {i: j.held for i, j in self.running.items()}
            hit |= set(self.network.jobs_crossing_rack(rack, crossing))
        for job_id in sorted(hit):
            self._recover(self.running[job_id], c, faulty)
        return v

    def _take_out(self, node: int, node_gpus: np.ndarray, v: Verdict) -> np.ndarray:
        """Apply the verdict to the node's and GPUs' states (engine.states' tables) and plan when
        they return; returns the GPU indices that left service."""
        if v.node_down:
            try:
                code = node_event_code(int(self.topo.node_state[node]), "quarantine" if v.lemon else "fault")
            except InvalidTransition:
                return node_gpus  # already out of service: its return is planned already
            self.topo.node_state[node] = code
            if v.lemon:  # a lemon stays out until an operator clears it
                self.quarantined.add(node)
            else:
                back = self.ph.out_of_service_s(v.returns, self.fleet.rng)
                self._push(self.now + back, "node_back", node)
            return node_gpus
        if v.gpu_down:
            faulty = node_gpus[[int(self.fleet.rng.integers(len(node_gpus)))]]
            gpu = int(faulty[0])
            try:
                self.topo.gpu_state[gpu] = gpu_event_code(int(self.topo.gpu_state[gpu]), "fault")
            except InvalidTransition:
                return faulty  # already down: its reset is planned already
            self._push(self.now + self.ph.out_of_service_s(v.returns, self.fleet.rng), "gpu_back", gpu)
            return faulty
        return node_gpus[:0]

    def _recover(self, job: _Job, c, faulty: np.ndarray) -> None:
        job.interruptions += 1
        choice = self.cfg.checkpoint
        saved_by_trigger = (
            choice.kind == CheckpointKind.TRIGGERED
            and c.memory_readable
            and self.luck.random() < choice.triggered_success
        )
        self._save(job, graceful=saved_by_trigger)
        spec = job.spec
        plan = plan_recovery(
            self.layout,
            job.held,
            faulty,
            c,
            owned=self.owner >= 0,
            topology=spec.topology,
            policy=choice,
            triggered_ok=saved_by_trigger if choice.triggered else None,
            state_bytes=checkpoint_bytes(spec.parameters, self.ph),
            physics=self.ph,
            min_gpus=spec.min_gpus,
            size_step=spec.size_step,
            yielding=self._yielding(),
            step_s=job.step_s,
        )
        detection = plan.steps[0].seconds
        job.ettr.add("detection", detection)
        self.recoveries.append((self.now, plan.outcome, plan.seconds))
        if plan.outcome == "requeue":
            self._stop(job, graceful=False, requeue=True)
            return
        if plan.outcome == "spare":  # jobs that borrowed the spares it takes are preempted first
            taken = {int(o) for o in self.owner[plan.replacement_gpus] if o >= 0 and o != spec.id}
            for victim in sorted(taken):
                self._stop(self.running[victim], graceful=True, requeue=True)
        self.owner[job.held] = -1
        held = np.union1d(np.setdiff1d(job.held, plan.lost_gpus), plan.replacement_gpus)
        job.held = held
        self.owner[held] = spec.id
        restart = plan.seconds  # detection + reschedule + restart + load, as planned
        job.ettr.add("restart", restart - detection)
        job.ettr.add("degraded", plan.degraded_s)  # trained on without a replica group meanwhile
        job.run_start = self.now + restart + plan.degraded_s
        job.version += 1
        self._policy(job)
        self._schedule_end(job)

    def _yielding(self) -> np.ndarray | None:
        """Spare GPUs held by jobs of queues allowed to borrow spares (None: no such queue)."""
        borrowers = {q.name for q in self.queues if q.may_use_spares}
        if not borrowers:
            return None
        on_spares = (self.owner >= 0) & self.topo.node_spare[self.topo.gpu_node]
        ids = {int(j) for j in np.unique(self.owner[on_spares]) if self.jobs[int(j)].spec.queue in borrowers}
        return on_spares & np.isin(self.owner, list(ids))

    def _on_gpu_back(self, gpu: int) -> None:
        self.topo.gpu_state[gpu] = gpu_event_code(int(self.topo.gpu_state[gpu]), "reset")
        self.dirty = True

    def _on_node_back(self, node: int) -> None:
        """A rebooted or repaired node returns to service (down, repairing, ready: the table's path)."""
        if node in self.quarantined:
            return
        self.topo.node_state[node] = node_event_code(
            node_event_code(int(self.topo.node_state[node]), "repair"), "return"
        )
        self.dirty = True

    # --- samples and the summary ----------------------------------------------------------------
    def _on_sample(self) -> None:
        self._push(self.now + self.cfg.sample_period_s, "sample")
        take_sample(self)
