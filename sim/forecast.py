"""The expected-start forecast backtested in the simulator (pure, seeded).

``Backtest`` is a what-if simulation that, every ``every_s`` of simulated time, forecasts every
pending job as production's refresh does (engine.forecast over the running jobs, the pending jobs,
the arrivals of the last ``window_s`` and the calibration from the forecasts already checked) and
keeps, for each job submitted since the last refresh and still waiting, its first forecast. When
the run ends, each such forecast is set against the job's real start: ``report`` gives the median
absolute error of the p50, the median wait, and the share of jobs that started before their p90.
Only jobs that waited until a refresh are scored, as only those see an estimate in production.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from engine.forecast import Arrivals, Calibration, ForecastConfig, expected_starts, group_of, run_time_scale
from sim.runs import as_pending
from sim.simulation import Simulation


class Backtest(Simulation):
    def __init__(self, *args, every_s: float = 600.0, window_s: float = 6 * 3600.0, forecast=None, **kw):
        super().__init__(*args, **kw)
        self.every_s, self.window_s = every_s, window_s
        self.forecast = forecast or ForecastConfig()
        self.refresh_s: list[float] = []
        self.pending_at_refresh: list[int] = []
        # job id -> (submitted, forecast at, p50, p90, played): its first forecast
        self.first: dict[int, tuple[float, float, float | None, float | None, float | None]] = {}
        self.groups: dict[int, tuple[str, str]] = {}  # job id -> its calibration group
        self.last_cycle = -1.0  # the last cycle that ran: the jobs submitted before it were tried

    def run(self, progress=None) -> dict:
        # a second after a cycle: as in production, where a submit asks for a cycle at once, a job
        # is forecast once a cycle has tried it, never while it waits for its first
        self._push(self.every_s + 1.0, "forecast")
        return super().run(progress)

    def _on_cycle(self) -> None:
        ran = self.cycles
        super()._on_cycle()
        if self.cycles != ran:
            self.last_cycle = self.now

    def _on_forecast(self) -> None:
        self._push(self.now + self.every_s, "forecast")
        new = [
            p
            for p in self.pending.values()
            if self.now - self.every_s < p.submitted_at <= self.last_cycle  # waiting, a cycle has tried it
        ]
        if not new:
            return
        fc = replace(self.forecast, run_time_scale=self._run_time_scale())
        t0 = time.perf_counter()
        estimates = expected_starts(
            self.layout,
            self.queues,
            self._running_view(),
            list(self.pending.values()),
            self.now,
            self.cfg.scheduler,
            fc,
            self._arrivals(),
            self._calibration(),
            **self.sites.for_cycle(self.now),
        )
        self.refresh_s.append(time.perf_counter() - t0)
        self.pending_at_refresh.append(len(self.pending))
        for p in new:
            e = estimates[p.id]
            self.first.setdefault(p.id, (p.submitted_at, self.now, e.p50, e.p90, e.played))
            self.groups.setdefault(p.id, group_of(p))

    def _arrivals(self) -> Arrivals:
        since = self.now - self.window_s
        recent = [  # as they were submitted: the whole of their work ahead
            replace(as_pending(j), estimated_duration_s=j.spec.work_s)
            for j in self.jobs.values()
            if since < j.spec.arrival <= self.now
        ]
        busy = float(sum(j.size for j in self.running.values()))
        return Arrivals(tuple(recent), min(self.window_s, self.now), busy)

    def _calibration(self) -> Calibration:
        """The forecasts of jobs that have started since, as production checks its own."""
        rows, groups = [], []
        for i, (_, at, _, _, played) in self.first.items():
            started = self.jobs[i].first_admit
            if played is not None and started is not None:
                rows.append((at, played, started))
                groups.append(self.groups[i])
        if not rows:
            return Calibration(np.empty(0))
        at, played, started = np.asarray(rows, dtype=float).T
        return Calibration.of(at, played, started, self.forecast.first_step_s, groups)

    def _run_time_scale(self) -> float:
        """Run time against the estimate given at the start, of the jobs that ended in the window."""
        since = self.now - self.window_s
        done = [j for j in self.jobs.values() if j.ended is not None and j.first_admit is not None]
        done = [j for j in done if j.ended > since]
        return run_time_scale([j.ended - j.first_admit for j in done], [j.spec.work_s for j in done])

    def report(self) -> dict:
        """Each scored job's first forecast against its real start (jobs still waiting at the end
        count as late where their p90 has passed, and are left out otherwise)."""
        errors, waits, covered, beyond = [], [], [], 0
        for job_id, (submitted, _, p50, p90, _) in self.first.items():
            started = self.jobs[job_id].first_admit
            if p50 is None:
                beyond += 1
            if started is None:
                if p90 is not None and p90 < self.now:
                    covered.append(False)
                continue
            waits.append(started - submitted)
            if p50 is not None:
                errors.append(abs(started - p50))
            covered.append(p90 is None or started <= p90)
        refresh = np.asarray(self.refresh_s)
        return {
            "scored": len(self.first),
            "beyond_horizon": beyond,
            "median_abs_error_s": _median(errors),
            "median_wait_s": _median(waits),
            "p90_coverage": round(float(np.mean(covered)), 4) if covered else None,
            "refreshes": len(refresh),
            "refresh_s_mean": round(float(refresh.mean()), 3) if len(refresh) else None,
            "pending_mean": round(float(np.mean(self.pending_at_refresh or [0])), 1),
        }


def _median(values) -> float | None:
    return round(float(np.median(values)), 1) if len(values) else None
