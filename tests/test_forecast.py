"""When will my job start: the queue played forward with the scheduler (engine.forecast), its p90
widened by how far past forecasts missed, backtested in the simulator; production refreshes it for
every pending job and shows it on the job page, the jobs list and the API."""

from __future__ import annotations

import numpy as np
import pytest

from engine.forecast import Arrivals, Calibration, ForecastConfig, expected_starts, run_time_scale
from engine.workload import PendingJob, QueueSpec
from tests.engine_helpers import layout_for, running

H100 = "H100-SXM"


def _cluster():
    """16 H100 GPUs (two nodes) and one queue with all of them as quota."""
    layout = layout_for(pods_per_dc=1, racks=1, nodes_per_rack=2, datacenters=1)
    return layout, [QueueSpec("q", nominal={H100: 16})]


def _job(job_id, gpus, duration, submitted=0.0, priority=0):
    return PendingJob(job_id, "q", gpus, priority, (H100,), "datacenter", submitted, duration)


def test_a_waiting_job_starts_when_the_gpus_it_needs_come_free():
    layout, queues = _cluster()
    busy = [running(layout, 1, "q", nodes=[0], end=3600.0), running(layout, 2, "q", nodes=[1], end=7200.0)]
    small, big = _job(10, 8, 1000.0), _job(11, 16, 100.0, submitted=1.0)
    out = expected_starts(layout, queues, busy, [small, big], 0.0)
    assert out[10].p50 == pytest.approx(3600.0)  # the first node back
    assert out[11].p50 == pytest.approx(7200.0)  # both nodes: the second job's end
    # no forecast checked yet: nine in ten are said to start within twice the wait (plus a step)
    assert out[10].p90 == pytest.approx(2 * (3600.0 + 60.0) - 60.0)
    assert busy[0].estimated_end == 3600.0 and len(busy) == 2  # the play changes nothing it was given


def test_priority_and_arrivals_push_a_start_later():
    layout, queues = _cluster()
    busy = [running(layout, 1, "q", nodes=[0, 1], end=3600.0)]
    low = _job(10, 8, 3600.0)
    alone = expected_starts(layout, queues, busy, [low], 0.0)[10].p50
    urgent = _job(11, 16, 7200.0, submitted=5.0, priority=5)  # later, but ahead in the queue's order
    behind = expected_starts(layout, queues, busy, [low, urgent], 0.0)
    assert alone == pytest.approx(3600.0)
    assert behind[11].p50 == pytest.approx(3600.0) and behind[10].p50 == pytest.approx(3600.0 + 7200.0)
    # urgent work keeps arriving (a 16-GPU hour every two hours, as over the last six): the first
    # comes as the GPUs free and goes ahead; the job starts in the gap after it
    recent = tuple(_job(100 + i, 16, 3600.0, priority=5) for i in range(3))
    crowded = expected_starts(layout, queues, busy, [low], 0.0, arrivals=Arrivals(recent, 6 * 3600.0))
    assert crowded[10].p50 == pytest.approx(alone + 3600.0)
    # an hour of it every hour leaves no gap: the job does not start within the horizon
    recent = tuple(_job(100 + i, 16, 3600.0, priority=5) for i in range(6))
    starved = expected_starts(layout, queues, busy, [low], 0.0, arrivals=Arrivals(recent, 6 * 3600.0))
    assert starved[10].p50 is None


def test_arrivals_bring_no_more_work_than_the_cluster_keeps_busy():
    recent = tuple(_job(100 + i, 16, 3600.0) for i in range(6))  # 16 GPUs' worth of work an hour
    per_hour = 3600.0
    assert Arrivals(recent, 6 * 3600.0).rate * per_hour == pytest.approx(1.0)
    assert Arrivals(recent, 6 * 3600.0, busy_gpus=8).rate * per_hour == pytest.approx(0.5)  # thinned to 8
    # jobs that run half their estimates bring half the work: 8 busy GPUs keep up with all of them
    assert Arrivals(recent, 6 * 3600.0, busy_gpus=8).rate_at(
        ForecastConfig(run_time_scale=0.5)
    ) * per_hour == pytest.approx(1.0)
    assert Arrivals(recent, 6 * 3600.0, busy_gpus=0).rate * per_hour == pytest.approx(1.0)  # nothing to go by


def test_a_job_no_datacenter_can_hold_has_no_start_and_a_stopped_queue_never_starts():
    layout, queues = _cluster()
    out = expected_starts(layout, queues, [], [_job(10, 32, 60.0)], 0.0)
    assert out[10].p50 is None and out[10].p90 is None
    stopped = [QueueSpec("q", nominal={H100: 16}, stopped=True)]
    assert expected_starts(layout, stopped, [], [_job(10, 8, 60.0)], 0.0)[10].p50 is None


def test_jobs_that_run_shorter_than_their_estimates_free_their_gpus_sooner():
    assert run_time_scale([1800, 900, 3600], [3600, 1800, 7200]) == pytest.approx(0.5)
    assert run_time_scale([], []) == 1.0  # nothing finished yet: estimates as given
    layout, queues = _cluster()
    busy = [running(layout, 1, "q", nodes=[0, 1], end=7200.0)]
    fc = ForecastConfig(run_time_scale=0.5)
    assert expected_starts(layout, queues, busy, [_job(10, 8, 60.0)], 0.0, forecast=fc)[
        10
    ].p50 == pytest.approx(3600.0)


def test_the_plays_already_checked_scale_the_wait_to_the_p50_and_the_p90():
    fc = ForecastConfig()
    assert Calibration(np.empty(0)).factors(fc) == (1.0, fc.default_widening)  # too few checked yet
    # forty jobs the play said would wait an hour: 37 started within 0.5-1.5 hours, three waited five
    at = np.zeros(40)
    played = np.full(40, 3600.0)
    started = np.concatenate([np.linspace(1800, 1.5 * 3600, 37), np.full(3, 5.0 * 3600)])
    calibration = Calibration.of(at, played, started, fc.first_step_s)
    middle, high = calibration.factors(fc)
    assert 0.9 < middle < 1.1 and 1.4 < high < 1.6
    layout, queues = _cluster()
    busy = [running(layout, 1, "q", nodes=[0, 1], end=3600.0)]
    e = expected_starts(layout, queues, busy, [_job(10, 8, 60.0)], 0.0, calibration=calibration)[10]
    assert e.played == pytest.approx(3600.0)
    assert e.p50 == pytest.approx(middle * 3660.0 - 60.0) and e.p90 == pytest.approx(high * 3660.0 - 60.0)
    # a queue whose plays were twice too slow has its p50 halved, while another queue's stays
    groups = [("q", H100)] * 40 + [("other", H100)] * 40
    both = Calibration.of(
        np.zeros(80),
        np.full(80, 3600.0),
        np.concatenate([np.full(40, 1770.0), np.full(40, 3600.0)]),
        60.0,
        groups,
    )
    table = both.table(fc)
    assert table[("q", H100)][0] == pytest.approx(0.5) and table[("other", H100)][0] == pytest.approx(1.0)
    e = expected_starts(layout, queues, busy, [_job(10, 8, 60.0)], 0.0, calibration=both)[10]
    assert e.p50 == pytest.approx(1770.0)
    # plays that were twice too slow, everyone's: the p50 halves the played wait
    halved = Calibration.of(at, played, np.full(40, 1800.0 - 30.0), fc.first_step_s)
    assert expected_starts(layout, queues, busy, [_job(10, 8, 60.0)], 0.0, calibration=halved)[
        10
    ].p50 == pytest.approx(1770.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("horizon_s", 0),
        ("first_step_s", -1),
        ("step_growth", 2),
        ("step_growth", 0),
        ("min_cycles", 0),
        ("quantile", 0.3),
        ("default_widening", 0.5),
    ],
)
def test_a_bad_setting_names_itself(field, value):
    """(and the windows' share of the time played follows the budget: fine for a short queue)"""
    fc = ForecastConfig()
    assert fc.growth(100) < 0.03 < 0.2 < fc.growth(10_000) < 0.5
    with pytest.raises(ValueError, match=field):
        ForecastConfig(**{field: value})


def test_in_the_simulator_a_forecast_made_while_waiting_holds_against_the_real_start():
    """A 16-GPU cluster busy for two hours; two 8-GPU jobs arrive behind it and are forecast ten
    minutes later, with the running job's end as the simulator gives it: both start when it ends
    (its restart and checkpoint overheads aside), well inside their p90."""
    from sim.config import SimConfig
    from sim.forecast import Backtest
    from sim.workload import SimJob

    layout, queues = _cluster()
    jobs = [
        SimJob(1, "q", 16, 0.0, 7200.0, H100),
        SimJob(2, "q", 8, 100.0, 3600.0, H100),
        SimJob(3, "q", 8, 200.0, 3600.0, H100),
    ]
    sim = Backtest(layout.topo, jobs, SimConfig(days=0.5, seed=1), queues=queues, every_s=600.0)
    sim.run()
    report = sim.report()
    assert set(sim.first) == {2, 3} and report["scored"] == 2
    first_end = sim.jobs[2].first_admit
    assert first_end > 7200.0 and sim.jobs[3].first_admit == first_end
    for job_id in (2, 3):
        _, at, p50, p90, _ = sim.first[job_id]
        assert at == pytest.approx(601.0) and abs(p50 - first_end) < 300 and first_end <= p90
    assert report["p90_coverage"] == 1.0 and report["median_wait_s"] > 7000


# --- production: the refresh, the API, the pages ---------------------------------------------------
def _submit(client, queue: str, gpus: int, duration: float, chip: str = "A100-80G") -> int:
    body = {"queue": queue, "gpus": gpus, "chip_types": [chip], "estimated_duration_s": duration}
    answer = client.post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()["id"]


def test_a_pending_job_is_told_when_it_will_start_and_the_forecast_is_checked(
    queues, operator_client, viewer_client, eager_celery
):
    from datetime import timedelta

    from django.conf import settings
    from django.test import Client
    from django.utils import timezone

    from scheduling import forecast
    from scheduling.cycle import run_cycle
    from scheduling.models import Job, JobForecast
    from scheduling.services import change_state
    from scheduling.tasks import forecast_starts

    assert settings.CELERY_BEAT_SCHEDULE["forecast-starts"]["task"] == "scheduling.tasks.forecast_starts"
    # legacy holds 12 A100 of quota: a 12-GPU hour runs, an 8-GPU job waits for it, then a 4-GPU one
    first = _submit(operator_client, "legacy", 12, 3600.0)
    run_cycle()
    waiting = _submit(operator_client, "legacy", 8, 600.0)
    after = _submit(operator_client, "legacy", 8, 600.0)
    run_cycle()
    assert Job.objects.get(pk=waiting).state == "pending"
    done = forecast_starts.delay().get()  # what beat runs: every pending job played
    assert done["pending"] == 2

    started = Job.objects.get(pk=first).started_at
    body = viewer_client.get(f"/api/v1/jobs/{waiting}/").json()
    expected = body["expected_start"]
    p50 = timezone.datetime.fromisoformat(expected["p50"])
    p90 = timezone.datetime.fromisoformat(expected["p90"])
    assert abs((p50 - (started + timedelta(seconds=3600))).total_seconds()) < 90  # when the hour ends
    assert p90 > p50 and timezone.datetime.fromisoformat(expected["computed_at"]) <= timezone.now()
    later = viewer_client.get(f"/api/v1/jobs/{after}/").json()["expected_start"]
    assert timezone.datetime.fromisoformat(later["p50"]) - p50 == timedelta(seconds=600)  # after the first
    listed = {j["id"]: j for j in viewer_client.get("/api/v1/jobs/", {"state": "pending"}).json()["results"]}
    assert listed[waiting]["expected_start"] == expected
    assert viewer_client.get(f"/api/v1/jobs/{first}/").json()["expected_start"] is None  # running

    page = Client()
    page.force_login(Job.objects.get(pk=waiting).owner)
    detail = page.get(f"/jobs/{waiting}/").content.decode()
    assert 'id="expected-start"' in detail and "nine in ten start before" in detail
    listing = page.get("/jobs/", {"state": "pending"}).content.decode()
    assert "in 59\xa0minutes / 2\xa0hours" in listing  # the hour left, and twice it until checked

    # the hour ends early: the job starts; the next refresh notes when, to check the forecast by it;
    # the job behind it is cancelled before it starts, and is never checked
    change_state(after, "cancel", actor="test")
    change_state(first, "cancel", actor="test")
    run_cycle()
    assert Job.objects.get(pk=waiting).state == "running"
    forecast.refresh()
    row = JobForecast.objects.get(pk=waiting)
    assert row.started_at == Job.objects.get(pk=waiting).started_at and row.first_p50 == p50
    assert row.first_played == p50  # nothing checked yet: the p50 is the play's start
    checked = forecast.checked(timezone.now())
    assert len(checked.ratios) == 1 and checked.ratios[0] < 0.1  # it waited far less than forecast
    assert JobForecast.objects.get(pk=after).started_at is None
    assert viewer_client.get(f"/api/v1/jobs/{waiting}/").json()["expected_start"] is None
