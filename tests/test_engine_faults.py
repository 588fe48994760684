"""Fault classification, checkpoint arithmetic and the effective-training-time simulation."""

import math

import pytest

from engine.checkpoint import CheckpointKind, daly_interval, expected_ettr, recommend, young_interval
from engine.faults import Action, Scope, classify, classify_xid
from engine.physics import Physics
from engine.policy import CheckpointPolicy
from sim.reliability import BUCKETS, simulate_training


@pytest.mark.parametrize(
    ("xid", "action", "interrupts", "readable"),
    [
        (13, Action.RESTART_JOB, True, True),
        (31, Action.RESTART_JOB, True, True),
        (43, Action.RESTART_JOB, True, True),
        (94, Action.RESTART_JOB, True, True),
        (46, Action.RESET_GPU, True, False),
        (62, Action.RESET_GPU, True, False),
        (64, Action.RESET_GPU, True, False),
        (95, Action.RESET_GPU, True, False),
        (109, Action.RESET_GPU, True, False),
        (119, Action.RESET_GPU, True, False),
        (120, Action.RESET_GPU, True, False),
        (79, Action.REBOOT_NODE, True, False),
        (63, Action.RESET_WHEN_CONVENIENT, False, True),
        (92, Action.OBSERVE, False, True),
        (145, Action.REBOOT_NODE, True, False),
        (999, Action.RESET_GPU, True, False),
    ],
)
def test_xid_codes_map_to_the_catalogue_actions(xid, action, interrupts, readable):
    c = classify_xid(xid)
    assert (c.action, c.interrupts_job, c.memory_readable) == (action, interrupts, readable)
    assert c.detection_s == 30.0


def test_the_xid_48_and_74_decision_trees():
    assert classify_xid(48).action == Action.RESET_GPU
    assert classify_xid(48, dbe_over_threshold=True).action == Action.REPAIR_NODE
    assert classify_xid(74).action == Action.RESET_GPU
    assert classify_xid(74, peer_faulted=True).action == Action.RESTART_JOB
    assert classify_xid(74, repeated_on_node=True).action == Action.REBOOT_NODE
    assert classify_xid(79).scope == Scope.NODE


def test_non_xid_sources_and_bad_input():
    assert classify("heartbeat_loss").action == Action.REBOOT_NODE
    hang = classify("job_hang")
    assert hang.detection_s > classify_xid(13).detection_s  # hangs are found later, by the watchdog
    assert classify("link_down").scope == Scope.LINK
    with pytest.raises(ValueError, match="unknown fault source 'gremlins'"):
        classify("gremlins")
    with pytest.raises(ValueError, match="needs its code"):
        classify("xid")


def test_young_and_daly_intervals():
    assert young_interval(60, 36_000) == pytest.approx(math.sqrt(2 * 60 * 36_000))
    tau = daly_interval(60, 36_000)
    assert young_interval(60, 36_000) - 60 < tau < young_interval(60, 36_000) * 1.1
    assert daly_interval(100, 40) == 40  # stall over twice the MTBF: checkpoint every MTBF
    rec = recommend(60, 36_000, 120, chosen=3600)
    assert rec.expected_ettr > rec.chosen_expected_ettr  # the recommendation beats an hourly interval
    assert expected_ettr(3600, 60, 36_000, 120) == pytest.approx(1 - 60 / 3600 - (1800 + 120) / 36_000)


def test_the_loss_buckets_and_productive_time_add_up_to_the_wall_time():
    report = simulate_training(
        2048, 70e9, CheckpointPolicy(CheckpointKind.ASYNC, 900, name="async"), days=20, seed=3
    )
    assert set(report.buckets) == set(BUCKETS)
    assert report.wall_s == pytest.approx(report.productive_s + sum(report.buckets.values()))
    assert report.interruptions > 0 and report.checkpoints > 0


def test_the_same_seed_gives_the_same_run():
    a = simulate_training(
        4096, 70e9, CheckpointPolicy(CheckpointKind.TRIGGERED, 600, name="t"), days=10, seed=11
    ).as_dict()
    b = simulate_training(
        4096, 70e9, CheckpointPolicy(CheckpointKind.TRIGGERED, 600, name="t"), days=10, seed=11
    ).as_dict()
    assert a == b


def test_periodic_ettr_matches_the_first_order_formula_over_a_long_run():
    """ETTR ~= 1 - stall/tau - (tau/2 + R)/M, with R the mean detection + restart and M the
    job's mean time between faults (no lemons, so M is constant)."""
    physics = Physics(lemon_node_fraction=0.0)
    gpus, params, tau = 16_384, 405e9, 1800.0
    report = simulate_training(
        gpus,
        params,
        CheckpointPolicy(CheckpointKind.PERIODIC, tau, name="p"),
        days=400,
        seed=7,
        physics=physics,
        spare_nodes=10_000,
    )
    mtbf = 86_400 / (gpus * physics.gpu_interruptions_per_day)
    stall = params * physics.bytes_per_parameter / (physics.storage_gbps(gpus) * 1e9)
    restart = (report.buckets["detection"] + report.buckets["restart"]) / report.interruptions
    analytic = expected_ettr(tau, stall, mtbf, restart)
    assert report.ettr == pytest.approx(analytic, abs=0.01)


def test_triggered_checkpoints_save_work_on_readable_faults():
    kw = {"days": 30, "seed": 5, "physics": Physics()}
    periodic = simulate_training(8192, 405e9, CheckpointPolicy(CheckpointKind.ASYNC, 1800, name="a"), **kw)
    triggered = simulate_training(
        8192, 405e9, CheckpointPolicy(CheckpointKind.TRIGGERED, 1800, name="t"), **kw
    )
    assert triggered.triggered_saved > 0
    assert triggered.buckets["lost_work"] < periodic.buckets["lost_work"]
    assert triggered.ettr > periodic.ettr


def test_without_spares_the_job_waits_for_repairs():
    report = simulate_training(
        1024, 7e9, CheckpointPolicy(CheckpointKind.ASYNC, 600, name="a"), days=60, seed=2, spare_nodes=0
    )
    assert report.buckets["waiting"] > 0
    with_spares = simulate_training(
        1024, 7e9, CheckpointPolicy(CheckpointKind.ASYNC, 600, name="a"), days=60, seed=2, spare_nodes=50
    )
    assert with_spares.buckets["waiting"] == 0
