"""Goodput at scale: recovery tiers (engine.tiers) in the training-run and cluster simulators, the
fidelity checks against published figures, and finding hung and slow nodes (engine.progress)."""

from __future__ import annotations

import numpy as np
import pytest

from engine import tiers
from engine.checkpoint import CheckpointKind
from engine.faults import classify
from engine.policy import CheckpointPolicy
from engine.progress import localize
from sim.progress import localization_stats
from sim.reliability import BUCKETS, simulate_training

TIERED = {t: CheckpointPolicy(CheckpointKind.TRIGGERED, None, tier=t, name=t) for t in tiers.TIERS}


def _ettr(gpus, params, policy, days=7, seeds=3, **kw):
    runs = [simulate_training(gpus, params, policy, days=days, seed=s, **kw) for s in range(seeds)]
    return float(np.mean([r.ettr for r in runs])), runs


def test_each_tier_recovers_more_of_a_100k_gpu_job_and_the_best_meets_the_targets():
    ettr = {t: _ettr(100_000, 2e12, TIERED[t]) for t in tiers.TIERS}
    order = [ettr[t][0] for t in tiers.TIERS]
    assert order == sorted(order)  # every tier adds to the one before it
    best, runs = ettr[tiers.RecoveryTier.REPLICA_GROUPS]
    assert best >= 0.98
    assert np.median(np.concatenate([r.recoveries_s for r in runs])) < 30.0  # fault to training again
    for r in runs:  # the loss buckets and the productive time add up to the wall time
        assert r.productive_s + sum(r.buckets[b] for b in BUCKETS) == pytest.approx(r.wall_s, rel=1e-9)
        assert r.buckets["degraded"] > 0 and r.buckets["restart"] == 0


def test_the_best_tier_meets_the_targets_at_10k_and_16k():
    assert _ettr(10_000, 405e9, TIERED["in_memory"])[0] >= 0.995
    assert _ettr(16_384, 405e9, TIERED["in_memory"])[0] >= 0.99
    assert _ettr(10_000, 405e9, TIERED["restart"])[0] < 0.995  # restart alone does not


def test_the_model_lands_near_published_figures():
    # Llama 3: periodic synchronous checkpoints, restart from durable storage, 16k GPUs, 54 days
    # ("higher than 90%" is a floor: the model, with restarts in place for faults that keep the
    # hardware, lands at about 97%, beside ByteRobust's 97% at 9,600 GPUs)
    llama, _ = _ettr(16_384, 405e9, CheckpointPolicy(CheckpointKind.PERIODIC, None, name="sync"), days=54)
    assert 0.90 < llama < 0.98
    # TorchFT-style replica groups lose about one step per fault
    _, runs = _ettr(16_384, 405e9, TIERED["replica_groups"])
    lost = np.mean([r.buckets["lost_work"] / r.interruptions for r in runs])
    assert lost <= tiers.step_seconds(405e9, 16_384)
    # Gemini: over 13x less time wasted per failure than restarting from remote storage
    remote = [
        simulate_training(
            128, 100e9, CheckpointPolicy(CheckpointKind.PERIODIC, None, name="r"), days=60, seed=s
        )
        for s in range(5)
    ]
    memory = CheckpointPolicy(CheckpointKind.ASYNC, None, tier="in_memory", name="m")
    gemini = [simulate_training(128, 100e9, memory, days=60, seed=s) for s in range(5)]

    def wasted(rs):
        return np.mean(
            [(r.buckets["lost_work"] + r.buckets["restart"]) / max(r.interruptions, 1) for r in rs]
        )

    assert wasted(remote) / wasted(gemini) > 13


def test_tier_costs_are_counted_not_assumed_free():
    base = tiers.costs("restart", parameters=2e12, gpus=100_000)
    memory = tiers.costs("in_memory", parameters=2e12, gpus=100_000)
    groups = tiers.costs("replica_groups", parameters=2e12, gpus=100_000, replica_groups=8)
    assert memory["host_memory_gb_per_node"] == pytest.approx(2 * base["host_memory_gb_per_node"], rel=0.01)
    assert 0 < memory["nic_share"] <= 0.10
    assert groups["throughput_overhead"] > 0 and groups["replica_group_gpus"] == 12_500
    assert groups["rejoin_s"] > 30  # start, communicators and the state copy take time


def test_fast_detection_shortens_what_the_control_plane_can_see():
    step = 6.0
    assert tiers.detection_seconds(classify("xid", 79), "restart", step) == 30.0
    assert tiers.detection_seconds(classify("xid", 79), "fast_detection", step) == 2.0
    assert tiers.detection_seconds(classify("job_hang"), "restart", step) == 300.0
    assert tiers.detection_seconds(classify("job_hang"), "fast_detection", step) == 35.0  # 30 s + a report
    assert tiers.detection_seconds(classify("heartbeat_loss"), "warm_restart", step) == 15.0
    assert tiers.detection_seconds(classify("host_maintenance"), "replica_groups", step) == 0.0


def test_a_replica_group_plan_trains_on_while_the_group_rejoins():
    c = classify("xid", 79)
    kw = {"gpus": 16_384, "state": 405e9 * 16, "from_memory": True, "moved": True, "step_s": 6.0}
    restart = tiers.recovery_steps(c, "restart", **kw)
    groups = tiers.recovery_steps(c, "replica_groups", replica_groups=8, **kw)
    assert [s.name for s in restart] == ["detect", "reschedule", "restart", "load"]
    assert [s.name for s in groups] == ["detect", "rejoin"]
    assert groups[1].throughput_lost == pytest.approx(1 / 8)


def test_the_cluster_simulator_compares_tiers_on_the_same_workload():
    from monitoring.whatif.simreport import parse_config, run_all
    from monitoring.whatif.simulations import cluster_document

    doc = cluster_document("demo")
    names = (
        "checkpoint=triggered",
        "checkpoint=triggered,tier=in_memory",
        "checkpoint=triggered,tier=replica_groups:4",
    )
    results = run_all(doc, [parse_config(n) for n in names], days=2, seed=3, jobs=None)
    assert results[0]["jobs"]["arrived"] == results[2]["jobs"]["arrived"]
    losses = [r["ettr"]["loss_share"] for r in results]
    assert losses[1]["restart"] <= losses[0]["restart"]
    assert "degraded" in losses[2]
    with pytest.raises(ValueError, match="tier"):
        parse_config("tier=replica_groups:1")
    with pytest.raises(ValueError, match="tier"):
        parse_config("tier=hot_swap")


def test_the_node_that_stopped_is_named_and_a_collective_hang_names_none():
    now = 100.0
    step = np.array([10, 10, 9, 10.0])  # node 2 never finished step 10
    step_at = np.array([60, 61, 55, 60.0])
    reported = np.full(4, 99.0)
    recent = np.full((4, 6), 5.0)
    v = localize(step, step_at, reported, recent, now)
    assert v.hung and v.culprits == (2,)
    v = localize(np.full(4, 10.0), step_at, reported, recent, now)
    assert v.hung and v.culprits == () and "collective" in v.reason
    assert not localize(step, step_at, reported, recent, 70.0).hung  # 9 s of quiet is no hang


def test_a_slow_node_is_a_straggler_and_one_slow_step_is_not():
    step = np.full(8, 10.0)
    step_at = np.full(8, 99.0)
    reported = np.full(8, 99.0)
    recent = np.full((8, 6), 5.0) + np.linspace(0, 0.1, 8)[:, None]
    recent[3, -4:] = 6.0  # 20% slower in its last four steps
    recent[5, -1] = 9.0  # one pause
    v = localize(step, step_at, reported, recent, 100.0)
    assert not v.hung and v.stragglers == (3,) and v.slowdown[3] > 1.1


def test_hung_and_slowed_nodes_are_named_within_a_minute_without_false_cordons():
    stats = localization_stats(150, seed=0)
    assert stats["faults"] == 100
    assert stats["named_within_60s"] >= 0.95
    assert stats["hang_named_within_60s"] >= 0.95 and stats["straggler_named_within_60s"] >= 0.95
    assert stats["false_cordon_share"] < 0.01


def test_operators_choose_a_tier_and_see_its_cost_and_stragglers_show_on_the_faults_page(
    queues, operator, operator_client
):
    from django.test import Client

    from scheduling.choices import EventKind
    from scheduling.models import CheckpointPolicy, Job, JobEvent

    r = operator_client.post(
        "/api/v1/checkpoint-policies/",
        {"name": "groups", "kind": "triggered", "recovery_tier": "replica_groups", "replica_groups": 1},
        format="json",
    )
    assert r.status_code == 400 and "replica_groups" in r.json()
    r = operator_client.post(
        "/api/v1/checkpoint-policies/",
        {"name": "groups", "kind": "triggered", "recovery_tier": "hot_swap"},
        format="json",
    )
    assert r.status_code == 400 and "recovery_tier" in r.json()
    assert not CheckpointPolicy.objects.filter(name="groups").exists()
    browser = Client()
    browser.force_login(operator)
    page = browser.post(
        "/checkpoint-policies/new/",
        {
            "name": "groups",
            "kind": "triggered",
            "recovery_tier": "replica_groups",
            "replica_groups": "16",
            "cordon_stragglers": "1",
            "interval_s": "",
            "triggered_success": "0.95",
            "description": "",
        },
    )
    assert page.status_code == 302
    policy = CheckpointPolicy.objects.get(name="groups")
    assert policy.replica_groups == 16 and policy.cordon_stragglers
    html = browser.get("/checkpoint-policies/").content.decode()
    assert "Replica groups (train on without the faulty group), 16 groups; cordons stragglers" in html
    assert "rejoin" in html and "host memory" in html
    from django.utils import timezone

    job = Job.objects.create(
        name="llm", queue=queues["vision"], gpus=8, checkpoint_policy=policy, submitted_at=timezone.now()
    )
    JobEvent.objects.create(
        job=job,
        at=timezone.now(),
        kind=EventKind.STRAGGLER,
        reason="n1 (rank 3): compute 1.42x the median",
        data={"node": "dc1-p1-r01-n01", "rank": 3, "slowdown": 1.42, "cordoned": True},
    )
    html = browser.get("/faults/").content.decode()
    assert 'id="stragglers"' in html and "1.42x" in html and "(rank 3)" in html
