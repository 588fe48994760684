"""When will a pending job start: the queue played forward with the scheduler itself (pure).

From now on, the running jobs end, new jobs arrive, and every step of the play is one cycle of
engine.scheduler.schedule over what is then running and pending: quotas, borrowing, priorities,
fair share, preemption, reservations and backfill act as they will in production. In the play:

- a job runs its estimate times ``run_time_scale`` (the median ratio of actual to estimated run
  time that finished jobs showed; ``run_time_scale``); the scheduler in the play still sees the
  estimates, as the real one will. A job without an estimate runs ``default_duration_s``;
- jobs keep arriving at the rate of the last hours, evenly spaced, each a copy of one of the jobs
  submitted in that window (``Arrivals``, drawn with a fixed seed).

The play gives each job a wait; what the play does not know (faults that send a gang back to the
queue and let smaller jobs in, estimates users give, the arrivals that will really come) is
corrected by how the plays already checked against real starts did (``Calibration``): the ratio of
the wait a job had to the wait its play gave, whose median scales the wait to the p50 and whose
0.9 quantile scales it to the p90 (1 and ``default_widening`` while fewer than ``min_checked``
jobs have been checked).

Steps follow the events (a job ends, a job arrives), merged into windows that widen with the time
played (``first_step_s`` at first, then a share of the time played), so a week ahead costs tens to
hundreds of cycles, not thousands. The share is set by a budget (``cycle_budget``, pending jobs
times cycles, within ``min_cycles`` and ``max_cycles``): a short queue is played in fine windows
(2% of the time played), 10,000 pending jobs in coarse ones (45%), because merged windows blur
the order of starts (a large job sees a whole window's free GPUs at once). A job started in a
window is said to start midway between the first and the last job that ended in it (at the end
where only one did), and its run counts from then.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

import numpy as np

from engine.placement import Layout
from engine.scheduler import SchedulerConfig, schedule
from engine.workload import MILLI, PendingJob, QueueSpec, RunningJob

DAY = 86_400.0


@dataclass(frozen=True)
class ForecastConfig:
    horizon_s: float = 7 * DAY  # a job not started this far ahead: no estimate (None)
    first_step_s: float = 60.0
    step_growth: float | None = None  # events are merged over this share of the time played so far
    cycle_budget: int = 250_000  # ... set so that pending jobs x cycles stays within this
    min_cycles: int = 25
    max_cycles: int = 300
    default_duration_s: float = 4 * 3600.0  # a job without an estimate runs this long
    run_time_scale: float = 1.0  # actual / estimated run time (run_time_scale())
    quantile: float = 0.9
    default_widening: float = 2.0  # the p90's factor on the played wait while too few are checked
    min_checked: int = 30
    max_arrivals_pending: int = 500  # the play stops adding arrivals while this many of them wait
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("horizon_s", "first_step_s", "default_duration_s", "run_time_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be above zero")
        if self.step_growth is not None and not 0 < self.step_growth <= 1:
            raise ValueError("step_growth must be above 0 and at most 1")
        if not 1 <= self.min_cycles <= self.max_cycles:
            raise ValueError("min_cycles must be at least 1 and at most max_cycles")
        if not 0.5 <= self.quantile < 1:
            raise ValueError("quantile must be at least 0.5 and below 1")
        if self.default_widening < 1:
            raise ValueError("default_widening must be at least 1")

    def growth(self, pending: int) -> float:
        """The windows' share of the time played, for a play of ``pending`` jobs: the finest whose
        cycles over the horizon stay within the budget."""
        if self.step_growth is not None:
            return self.step_growth
        cycles = min(self.max_cycles, max(self.min_cycles, self.cycle_budget // max(1, pending)))
        lo, hi = 1e-3, 1.0  # cycles(g): 1/g of first steps, then geometric to the horizon
        for _ in range(40):
            g = (lo + hi) / 2
            n = 1 / g + math.log(max(1.0, self.horizon_s * g / self.first_step_s)) / math.log1p(g)
            lo, hi = (g, hi) if n > cycles else (lo, g)
        return hi


def run_time_scale(actual, estimated) -> float:
    """The median ratio of finished jobs' run times to their estimates (1 without two such jobs)."""
    a, e = np.asarray(actual, dtype=float), np.asarray(estimated, dtype=float)
    ok = (a > 0) & (e > 0)
    if ok.sum() < 2:
        return 1.0
    return float(np.exp(np.median(np.log(a[ok] / e[ok]))))


@dataclass(frozen=True)
class Arrivals:
    """The jobs submitted over the last ``window_s`` seconds: the arrival rate and the shapes of
    the jobs to come (each a copy of one of them). ``busy_gpus``: the GPUs the cluster keeps busy
    now; a stream that would bring more work than that (a window with two week-long gangs in it,
    played forward for a week) is thinned to it, as no cluster keeps up with more for long."""

    recent: tuple[PendingJob, ...] = ()
    window_s: float = 0.0
    busy_gpus: float | None = None

    @property
    def rate(self) -> float:
        return self.rate_at(ForecastConfig())

    def rate_at(self, fc: ForecastConfig) -> float:
        """Jobs per second to come, for jobs that run as the play runs them (``played_duration``;
        no thinning while nothing is busy: there is no measure of what the cluster keeps up with)."""
        if self.window_s <= 0 or not self.recent:
            return 0.0
        rate = len(self.recent) / self.window_s
        if not self.busy_gpus:
            return rate
        work = sum(j.gpus * j.share / MILLI * played_duration(j, fc) for j in self.recent) / self.window_s
        return rate * min(1.0, self.busy_gpus / work) if work > 0 else rate


def played_duration(job: PendingJob, fc: ForecastConfig, gpus: int | None = None) -> float:
    """How long ``job`` runs in the play on ``gpus`` GPUs (its request when None): its estimate (or
    ``fc.default_duration_s``) times ``fc.run_time_scale``, longer for an elastic job admitted
    smaller."""
    estimate = (
        fc.default_duration_s if job.estimated_duration_s is None else max(job.estimated_duration_s, 1.0)
    )
    return estimate * job.gpus / max(1, gpus or job.gpus) * fc.run_time_scale


def group_of(job: PendingJob) -> tuple[str, str]:
    """The jobs a calibration is kept for together: the same queue and first chip type."""
    return job.queue, job.chip_types[0] if job.chip_types else ""


@dataclass(frozen=True)
class Calibration:
    """Past plays against what happened: for each job the play said at ``at`` would start at
    ``played`` and that has started since, (wait it had + step) / (wait played + step), with the
    job's group (``group_of``; None: not known)."""

    ratios: np.ndarray
    groups: tuple | None = None

    @classmethod
    def of(cls, at, played, started, step: float = 60.0, groups=None) -> Calibration:
        at, played, started = (np.asarray(x, dtype=float).ravel() for x in (at, played, started))
        return cls(
            (started - at + step) / (played - at + step), tuple(groups) if groups is not None else None
        )

    def factors(self, fc: ForecastConfig) -> tuple[float, float]:
        """What the played wait is multiplied by for the p50 and for the p90: the median and the
        ``fc.quantile`` of the ratios (1 and ``fc.default_widening`` while too few are checked)."""
        return self.table(fc)[None]

    def table(self, fc: ForecastConfig) -> dict:
        """The factors of every group with at least ``fc.min_checked`` checked jobs, and of all of
        them together (key None): a queue whose jobs the plays keep getting wrong one way is
        corrected by its own record, not by everyone's."""
        ok = np.isfinite(self.ratios) & (self.ratios > 0)
        out = {None: _factors(self.ratios[ok], fc) or (1.0, fc.default_widening)}
        if self.groups is None:
            return out
        by_group: dict = {}
        for ratio, group, good in zip(self.ratios, self.groups, ok, strict=True):
            if good:
                by_group.setdefault(group, []).append(ratio)
        for group, ratios in by_group.items():
            found = _factors(np.asarray(ratios), fc)
            if found is not None:
                out[group] = found
        return out


def _factors(ratios: np.ndarray, fc: ForecastConfig) -> tuple[float, float] | None:
    if len(ratios) < fc.min_checked:
        return None
    return float(np.median(ratios)), float(np.quantile(ratios, fc.quantile))


@dataclass(frozen=True)
class ExpectedStart:
    p50: float | None  # seconds on the clock the forecast was given; None: beyond the horizon
    p90: float | None
    played: float | None = None  # the start in the play, before the calibration (what it checks)


def expected_starts(
    layout: Layout,
    queues: list[QueueSpec],
    running: list[RunningJob],
    pending: list[PendingJob],
    now: float,
    config: SchedulerConfig | None = None,
    forecast: ForecastConfig | None = None,
    arrivals: Arrivals | None = None,
    calibration: Calibration | None = None,
    **sites,
) -> dict[int, ExpectedStart]:
    """The expected start of every job in ``pending`` (``sites``: what the cycle is given, e.g.
    links and unreachable)."""
    fc = forecast or ForecastConfig()
    if not pending:
        return {}
    play = _Play(layout, queues, running, pending, now, config or SchedulerConfig(), fc, sites)
    starts = play.run(arrivals or Arrivals())
    table = (calibration or Calibration(np.empty(0))).table(fc)
    step, end = fc.first_step_s, now + fc.horizon_s
    out = {}
    for job in pending:
        t = starts.get(job.id)
        if t is None:
            out[job.id] = ExpectedStart(None, None)
            continue
        middle, high = table.get(group_of(job), table[None])
        wait = t - now + step
        p50 = max(now, now + middle * wait - step)
        p90 = max(p50, now + high * wait - step)
        out[job.id] = ExpectedStart(p50 if p50 <= end else None, p90 if p90 <= end else None, t)
    return out


class _Play:
    """One play of the queue from now; ``run`` returns the start of each job pending at first."""

    def __init__(self, layout, queues, running, pending, now, config, fc: ForecastConfig, sites):
        self.layout, self.queues, self.config, self.fc, self.sites = layout, queues, config, fc, sites
        self.now = now
        self.running = {j.id: j for j in running if len(j.held)}
        self.pending = {j.id: j for j in pending}
        self.specs: dict[int, PendingJob] = dict(self.pending)  # what a preempted job asks again
        self.ends: list[tuple[float, int]] = []  # (the time it really ends, job id), a heap
        self.end_of: dict[int, float] = {}

    def run(self, arrivals: Arrivals) -> dict[int, float]:
        fc, now = self.fc, self.now
        for job in self.running.values():
            estimated = job.estimated_end if job.estimated_end is not None else now + fc.default_duration_s
            left = max(fc.first_step_s, estimated - now)  # a job past its estimate ends soon
            self._ends_at(job.id, now + left * fc.run_time_scale)
        targets, starts = set(self.pending), {}
        rng = np.random.default_rng([fc.seed, 17])
        rate = arrivals.rate_at(fc)
        gap = 1 / rate if rate > 0 else math.inf
        next_arrival, new_id = now + gap / 2, -1
        t, freed = now, None  # freed: the first and the last end in the window before this cycle
        while len(starts) < len(targets) and t <= now + fc.horizon_s:
            for job_id, began in self._cycle(t, t if freed is None else sum(freed) / 2):
                if job_id in targets and job_id not in starts:
                    starts[job_id] = began
            first = min(self._next_end(), next_arrival)
            if first == math.inf:
                break  # nothing ends and nothing arrives: what is pending stays pending
            growth = fc.growth(len(self.pending))  # what is pending now: arrivals widen the windows
            upto = max(first, t + max(fc.first_step_s, growth * (t - now)))
            last, freed = t, None
            while self.ends and self.ends[0][0] <= upto:
                end, job_id = heapq.heappop(self.ends)
                if self.end_of.get(job_id) == end and self.running.pop(job_id, None) is not None:
                    last = max(last, end)
                    freed = (freed[0] if freed else end, end)
            while next_arrival <= upto:
                if len(self.pending) < len(targets) + fc.max_arrivals_pending:
                    template = arrivals.recent[int(rng.integers(len(arrivals.recent)))]
                    job = replace(template, id=new_id, submitted_at=next_arrival)
                    self.pending[new_id] = self.specs[new_id] = job
                    new_id -= 1
                last = max(last, next_arrival)
                next_arrival += gap
            t = max(last, t + fc.first_step_s)
        return starts

    def _ends_at(self, job_id: int, end: float) -> None:
        self.end_of[job_id] = end
        heapq.heappush(self.ends, (end, job_id))

    def _next_end(self) -> float:
        while self.ends and self.end_of.get(self.ends[0][1]) != self.ends[0][0]:
            heapq.heappop(self.ends)  # an end of an earlier run of a preempted job
        return self.ends[0][0] if self.ends else math.inf

    def _cycle(self, t: float, began: float) -> list[tuple[int, float]]:
        """One scheduling cycle at ``t``, applied to the play; returns the jobs it started, each
        with when it is said to start: ``began`` (inside the window the cycle closes) or its
        submission if later. Its run counts from then, so the play's clock does not fall behind
        by a window at each start."""
        running, pending = list(self.running.values()), list(self.pending.values())
        result = schedule(self.layout, self.queues, running, pending, t, self.config, **self.sites)
        for p in result.preemptions:
            job = self.running.pop(p.job_id)
            self.pending[job.id] = self._requeued(job, t)
            self.end_of.pop(job.id, None)
        for r in result.resizes:
            if r.job_id in self.running:
                self.running[r.job_id] = replace(self.running[r.job_id], held=r.held)
        started = []
        for a in result.admissions:
            job = self.pending.pop(a.job_id)
            runs = played_duration(job, self.fc, len(a.held))
            start = min(t, max(began, job.submitted_at))
            estimated_end = start + runs / self.fc.run_time_scale  # what the play's scheduler sees
            self.running[job.id] = replace(
                job.started(a.held, a.chip, start, a.parts), estimated_end=estimated_end
            )
            self._ends_at(job.id, start + runs)
            started.append((job.id, start))
        return started

    def _requeued(self, job: RunningJob, t: float) -> PendingJob:
        """A job the play preempted, pending again for what it had left."""
        left = max(self.fc.first_step_s, self.end_of.get(job.id, t) - t)
        spec = self.specs.get(job.id)
        if spec is not None:
            return replace(spec, estimated_duration_s=left)
        return PendingJob(
            job.id,
            job.queue,
            job.max_gpus or len(job.held),
            job.priority,
            (job.chip,),
            job.topology,
            job.started_at,
            left,
            job.min_gpus,
            job.size_step,
            job.share,
        )
