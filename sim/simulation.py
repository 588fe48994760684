"""What-if simulation of a whole cluster on a virtual clock (pure, seeded, in memory).

The production controller runs unchanged: every scheduling cycle is engine.scheduler.schedule over
the cluster's arrays (with its datacenter links and partitions), every fault is judged by the fault
verdict (engine.lifecycle.judge) and recovered by engine.recovery.plan_recovery, the invariant
checker can run after every cycle. Around it a discrete-event loop moves time: job arrivals,
periodic scheduling cycles, completions, faults drawn by the fleet model, recovery, repairs and
hourly samples. Its parts: each job's runs and where their time went (sim.runs), the hardware
(sim.hardware), inference services (sim.autoscale), links and partitions (sim.sites), the report
(sim.summary).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import replace

import numpy as np

from engine.checkpoint import CheckpointKind
from engine.invariants import check_cycle
from engine.lifecycle import Verdict, checkpoint_bytes, saves_on_demand
from engine.network import Network
from engine.placement import Layout
from engine.recovery import plan_recovery
from engine.scheduler import collections_deferred, schedule
from engine.sites import SiteLinks
from engine.topology import TopologySnapshot
from engine.workload import PendingJob, QueueSpec, RunningJob
from sim import runs
from sim.autoscale import AUTOSCALE_S, Services
from sim.config import SimConfig, default_queues
from sim.hardware import Hardware
from sim.runs import JobRun, as_pending
from sim.sites import SiteBook
from sim.summary import summarize, take_sample
from sim.workload import SimJob, SimService

DAY = 86_400.0


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
        self.events: list[tuple[float, int, str, tuple]] = []
        self._seq = 0
        self.hardware = Hardware(self.topo, self.layout, self.ph, self.cfg.fleet, self.cfg.seed, self._push)
        self.network = Network(self.topo, datacenter_links=datacenter_links)
        self.net_rng = np.random.default_rng([self.cfg.seed, 5])
        self.sites = SiteBook(site_links, self.cfg.partitions, self.topo)  # links, partitions, shares
        self.services = Services(services)
        capacity = {c: n for c, n in self.topo.count_by_chip().items() if n}
        self.queues = queues or default_queues(capacity, self.services.gpus_by_chip())
        self._next_id = max((j.id for j in jobs), default=0) + 1
        self.jobs = {j.id: JobRun.of(j) for j in jobs}
        self.pending: dict[int, PendingJob] = {}
        self.running: dict[int, JobRun] = {}
        self.owner = np.full(self.topo.num_gpus, -1, dtype=np.int64)  # the job on each GPU (-1: none)
        self.luck = np.random.default_rng([self.cfg.seed, 3])
        self.now, self.dirty = 0.0, True
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
        self.hardware.draw_next(self.now)
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
    def _queue(self, job: JobRun) -> None:
        self.pending[job.spec.id] = as_pending(job)

    def new_job_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def submit(self, spec: SimJob) -> None:
        """A job submitted now (an inference replica the autoscaler adds): it arrives at once."""
        self.jobs[spec.id] = JobRun.of(spec)
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
            key = (job.version, job.checkpoints(self.now))
            cached = self._views.get(job.spec.id)
            if cached is None or cached[0] != key:
                cached = self._views[job.spec.id] = (key, runs.as_running(job, self.now))
            view.append(cached[1])
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
        with collections_deferred():  # as the scheduling worker runs its cycles
            result = schedule(
                self.layout, self.queues, running, pending, self.now, self.cfg.scheduler, **sites
            )
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
    def _start(self, job: JobRun, held: np.ndarray, *, resumed: bool, slowdown: float = 0.0) -> None:
        runs.start(job, held, self.now, self.ph, resumed=resumed, slowdown=slowdown)
        runs.set_policy(job, self.cfg.checkpoint, self.ph)
        self.owner[job.held] = job.spec.id
        self.running[job.spec.id] = job
        self._schedule_end(job)

    def _schedule_end(self, job: JobRun) -> None:
        """The job ends when its remaining work is done at its size, less checkpoint stalls; an
        end event of an older run (older version) is ignored."""
        self._push(job.finish_time(), "end", job.spec.id, job.version)

    def _save(self, job: JobRun, *, graceful: bool) -> float:
        """Account the run so far; returns the GPU-seconds lost. Graceful: the policy can save now."""
        return runs.save(job, self.now, saves=graceful and saves_on_demand(self.cfg.checkpoint.kind))

    def _release(self, job: JobRun) -> None:
        """The job's GPUs are free and the scheduler is asked again."""
        self.owner[job.held] = -1
        del self.running[job.spec.id]
        self.sites.stopped(job.spec.id, self.now)
        self.dirty = True

    def _stop(self, job: JobRun, *, graceful: bool, requeue: bool) -> None:
        self._save(job, graceful=graceful)
        self._release(job)
        job.version += 1
        job.held = None
        if requeue:
            job.waiting_since = self.now
            self._queue(job)

    def _on_end(self, job_id: int, version: int) -> None:
        job = self.running.get(job_id)
        if job is None or job.version != version:
            return  # preempted, resized or recovered since: a newer end event stands
        self._release(job)
        runs.finish(job, self.now)

    # --- inference services -------------------------------------------------------------------
    def _on_autoscale(self) -> None:
        self._push(self.now + AUTOSCALE_S, "autoscale")
        self.services.step(self)

    # --- faults and repairs --------------------------------------------------------------------
    def _on_fault(self, node: int, cause: str) -> None:
        self.hardware.draw_next(self.now)
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
        v, faulty = self.hardware.fault(node, self.now, source, xid, cause)
        self.dirty = True
        if not v.interrupts_job:
            return v
        hit = {int(j) for j in self.owner[self.hardware.node_gpus(node)] if j >= 0}
        if cause == "network":
            # a switch or link fault on the rack's uplink: every job crossing it is interrupted
            rack = int(self.topo.node_rack[node])
            crossing = {i: j.held for i, j in self.running.items()}
            hit |= set(self.network.jobs_crossing_rack(rack, crossing))
        for job_id in sorted(hit):
            self._recover(self.running[job_id], v.classification, faulty)
        return v

    def _recover(self, job: JobRun, c, faulty: np.ndarray) -> None:
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
        runs.recovered(job, held, self.now, plan)
        runs.set_policy(job, choice, self.ph)
        self.owner[held] = spec.id
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
        self.hardware.gpu_back(gpu)
        self.dirty = True

    def _on_node_back(self, node: int) -> None:
        self.dirty = self.hardware.node_back(node) or self.dirty

    # --- samples and the summary ----------------------------------------------------------------
    def _on_sample(self) -> None:
        self._push(self.now + self.cfg.sample_period_s, "sample")
        take_sample(self)
