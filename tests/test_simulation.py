"""The what-if simulator: the production controller on a virtual clock. Determinism, invariants
after every cycle, fidelity to Llama 3's interruption count, and the checkpoint arithmetic."""

import json
import math

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from engine.checkpoint import CheckpointKind
from engine.chips import BY_NAME
from engine.policy import CheckpointPolicy
from engine.presets import preset_document
from engine.synthetic import snapshot_from_spec
from engine.topology_spec import parse_topology
from sim.config import SimConfig
from sim.simulation import Simulation
from sim.workload import SimJob, generate, load_workload


def topology(doc):
    return snapshot_from_spec(parse_topology(doc, set(BY_NAME)))


def one_pod_type(pods, racks, nodes_per_rack, spares, chip="H100-SXM"):
    return topology(
        {
            "regions": [
                {
                    "name": "r",
                    "datacenters": [
                        {
                            "name": "dc",
                            "pods": [
                                {
                                    "chip_type": chip,
                                    "count": pods,
                                    "racks": racks,
                                    "nodes_per_rack": nodes_per_rack,
                                    "gpus_per_node": 8,
                                    "spare_nodes": spares,
                                }
                            ],
                        }
                    ],
                }
            ]
        }
    )


@pytest.fixture(scope="module")
def demo():
    return topology(preset_document("demo"))


def _without_timing(summary):
    out = {k: v for k, v in summary.items() if k != "engine"}
    out["engine"] = {k: v for k, v in summary["engine"].items() if k not in ("wall_s", "events_per_s")}
    return out


def test_same_seed_same_inputs_same_summary(demo):
    capacity = {c: n for c, n in demo.count_by_chip().items() if n}
    jobs = generate(capacity, 2, seed=4)
    a = Simulation(demo, jobs, SimConfig(days=2, seed=4)).run()
    b = Simulation(demo, jobs, SimConfig(days=2, seed=4)).run()
    assert json.dumps(_without_timing(a), sort_keys=True) == json.dumps(_without_timing(b), sort_keys=True)
    c = Simulation(demo, jobs, SimConfig(days=2, seed=5)).run()
    assert _without_timing(c)["series"] != _without_timing(a)["series"]


def test_the_invariant_checker_passes_after_every_cycle_and_the_books_balance(demo):
    capacity = {c: n for c, n in demo.count_by_chip().items() if n}
    jobs = generate(capacity, 3, seed=2, elastic_share=0.5)
    sim = Simulation(demo, jobs, SimConfig(days=3, seed=2, check_invariants=True))
    out = sim.run()
    assert out["engine"]["invariant_checks"] == out["engine"]["cycles"] > 100
    for s in out["series"]["samples"]:
        assert 0 <= s["busy"] <= s["allocated"] <= out["gpus"]  # never above 100%
    # the GPUs the simulator marks as held are exactly those of its running jobs
    held = np.flatnonzero(sim.owner >= 0)
    running = np.sort(np.concatenate([j.held for j in sim.running.values()])) if sim.running else held[:0]
    assert np.array_equal(held, running)
    assert len(np.unique(running)) == len(running)
    # nobody holds a GPU that is out of service
    down = (sim.topo.gpu_state != 0) | (sim.topo.node_state[sim.topo.gpu_node] != 0)
    assert not (down & (sim.owner >= 0)).any()
    assert out["jobs"]["ended"] > 0 and out["faults"]["total"] > 0


def test_llama3_interruptions_over_54_days_on_16384_gpus():
    # 16 pods of 132 nodes (4 spare each): 16,384 GPUs in the job, 512 spare
    topo = one_pod_type(16, 12, 11, 4)
    job = SimJob(1, "pretrain", 16384, 0.0, 80 * 86400.0, "H100-SXM", "datacenter", 10, parameters=405e9)
    out = Simulation(topo, [job], SimConfig(days=54, seed=0)).run()
    assert 419 * 0.85 <= out["faults"]["interruptions"] <= 419 * 1.15
    assert out["recoveries"]["by_outcome"].get("requeue", 0) == 0  # spares and free GPUs replace nodes


def test_periodic_checkpoint_ettr_matches_the_formula():
    topo = one_pod_type(2, 8, 10, 8)  # 1,280 GPUs, 128 spare
    tau = 3600.0
    job = SimJob(1, "pretrain", 1024, 0.0, 400 * 86400.0, "H100-SXM", "datacenter", 10, parameters=70e9)
    config = SimConfig(days=300, seed=3, checkpoint=CheckpointPolicy(CheckpointKind.PERIODIC, tau))
    sim = Simulation(topo, [job], config)
    out = sim.run()
    (record,) = out["series"]["ettr_jobs"]
    run = sim.jobs[1]
    n = record["interruptions"]
    assert n > 100
    mtbf = record["wall_s"] / n
    recovery = (record["detection_s"] + record["restart_s"]) / n
    stall = run.stall_fraction
    expected = 1 - stall - (tau / 2 + recovery) / mtbf
    assert record["ettr"] == pytest.approx(expected, abs=0.01)


def test_workload_files_load_and_bad_rows_name_the_row_and_column():
    rows = [
        {"arrival_s": "10", "gpus": "8", "work_s": "3600", "chip": "H100-SXM"},
        {
            "arrival_s": "0",
            "gpus": "1024",
            "work_s": "86400",
            "chip": "H100-SXM",
            "min_gpus": "512",
            "size_step": "8",
        },
    ]
    jobs = load_workload(rows, {"H100-SXM"})
    assert [j.gpus for j in jobs] == [1024, 8] and jobs[0].min_gpus == 512 and jobs[0].id == 1
    with pytest.raises(ValueError, match="workload row 1: column gpus must be a number"):
        load_workload([{"arrival_s": 0, "gpus": "many", "work_s": 1, "chip": "H100-SXM"}], {"H100-SXM"})
    with pytest.raises(ValueError, match="row 1: column chip 'TPU'"):
        load_workload([{"arrival_s": 0, "gpus": 1, "work_s": 1, "chip": "TPU"}], {"H100-SXM"})


def test_the_generator_follows_the_trace_summaries():
    jobs = generate({"H100-SXM": 100_000}, 30, seed=0, jobs=20_000, pretrain_share=0.0)
    sizes = np.array([j.gpus for j in jobs])
    assert np.median(sizes) == 1 and 20 < sizes.mean() < 34 and sizes.max() <= 1024  # Kalos: 1, 26.8, 1024
    outcomes = [j.outcome for j in jobs]
    assert 0.36 < outcomes.count("failed") / len(jobs) < 0.44
    work = np.array([j.work_s for j in jobs if j.outcome == "completed"])
    assert 900 < np.median(work) < 1500  # Philly: median 1,186 s
    assert math.isclose(len(jobs), 20_000, rel_tol=0.01)
    helios = generate({"H100-SXM": 100_000}, 30, seed=0, jobs=20_000, pretrain_share=0.0, trace="helios")
    sizes = np.array([j.gpus for j in helios])
    assert np.median(sizes) == 1 and 3 < sizes.mean() < 4.5 and sizes.max() <= 2048  # Helios: 3.7
    outcomes = [j.outcome for j in helios]
    assert 0.13 < outcomes.count("failed") / len(helios) < 0.18


def test_the_simulate_command_compares_configurations(tmp_path, capsys):
    call_command(
        "simulate",
        "demo",
        "--days",
        "1",
        "--seed",
        "1",
        "--compare",
        "checkpoint=periodic:3600",
        "checkpoint=triggered,spares=4",
        "--out",
        str(tmp_path),
    )
    out = capsys.readouterr().out
    assert "checkpoint=periodic:3600" in out and "checkpoint=triggered,spares=4" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [s["name"] for s in summary] == ["checkpoint=periodic:3600", "checkpoint=triggered,spares=4"]
    assert summary[0]["jobs"]["arrived"] == summary[1]["jobs"]["arrived"]  # the same workload
    html = (tmp_path / "report.html").read_text()
    assert html.count("Plotly.newPlot") >= 6 and '<script src="http' not in html


def test_the_simulate_command_refuses_bad_configurations(tmp_path):
    with pytest.raises(CommandError, match="'spare=3' is not one of"):
        call_command("simulate", "demo", "--compare", "spare=3", "--out", str(tmp_path))
    with pytest.raises(CommandError, match="--days"):
        call_command("simulate", "demo", "--days", "0", "--out", str(tmp_path))


def test_simulations_by_api_run_as_a_task_with_a_report(
    small_cluster, operator_client, viewer_client, eager_celery, django_capture_on_commit_callbacks
):
    body = {
        "name": "spares",
        "cluster": "inventory",
        "days": 1,
        "seed": 2,
        "configurations": ["checkpoint=async", "checkpoint=periodic:1800"],
    }
    assert viewer_client.post("/api/v1/simulations/", body, format="json").status_code == 403
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_client.post("/api/v1/simulations/", body, format="json")
    assert response.status_code == 201, response.json()
    detail = viewer_client.get(f"/api/v1/simulations/{response.json()['id']}/").json()
    assert detail["state"] == "done" and detail["progress"] == 1.0, detail["error"]
    names = [r["name"] for r in detail["summary"]["results"]]
    assert names == ["checkpoint=async", "checkpoint=periodic:1800"]
    assert detail["summary"]["results"][0]["gpus"] == 76  # the inventory as built: 64 H100 + 12 A100
    report = viewer_client.get(detail["report_url"])
    assert report.status_code == 200 and b"Plotly.newPlot" in b"".join(report.streaming_content)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cluster": "moon", "days": 1}, "cluster"),
        ({"cluster": "demo", "days": 0}, "days"),
        ({"cluster": "demo", "days": 1, "configurations": ["spares=lots"]}, "configurations"),
    ],
)
def test_bad_simulation_requests_name_the_field(small_cluster, operator_client, body, field):
    from monitoring.models import Simulation

    response = operator_client.post("/api/v1/simulations/", body, format="json")
    assert response.status_code == 400 and field in response.json()
    assert not Simulation.objects.exists()


def test_inference_replicas_follow_the_day_in_the_simulation(demo):
    from sim.workload import default_services

    capacity = {c: n for c, n in demo.count_by_chip().items() if n}
    services = default_services(capacity, 0.1)
    jobs = generate(capacity, 1, seed=6)
    sim = Simulation(demo, jobs, SimConfig(days=1, seed=6, check_invariants=True), services=services)
    out = sim.run()
    by_hour = {int(s["t"] // 3600): s["inference_replicas"] for s in out["series"]["samples"]}
    assert by_hour[15] > by_hour[3]  # the afternoon peak needs more replicas than the night
    assert by_hour[15] <= services[0].max_replicas
    (svc,) = out["inference"]
    assert svc["replica_hours"] > 0 and svc["service"] == "chat"
    assert any(q.name == "inference" for q in sim.queues)


def test_each_configuration_run_alone_gives_what_the_whole_sweep_gives():
    """A sweep's tasks run one configuration each, on the workload drawn for the first
    configuration's cluster, so a fanned-out sweep reports what one process running all would."""
    from monitoring.whatif.simreport import parse_config, run_all
    from monitoring.whatif.simulations import cluster_document

    doc = cluster_document("demo")
    configs = [parse_config(c) for c in ("baseline", "spares=4", "checkpoint=periodic:1800")]
    whole = run_all(doc, configs, days=0.5, seed=3, jobs=None)
    parts = [run_all(doc, configs, days=0.5, seed=3, jobs=None, only=i)[0] for i in range(len(configs))]
    for alone, together in zip(parts, whole, strict=True):
        assert alone["name"] == together["name"]
        for key in ("jobs", "utilization", "ettr", "faults", "series"):
            assert alone[key] == together[key], (alone["name"], key)


def test_the_simulate_command_runs_a_sweep_on_the_workers(db, tmp_path, eager_celery, capsys):
    """--on-workers stores the sweep and runs one task per configuration, as the API does; the
    same files come out."""
    from monitoring.models import Simulation as Stored

    out = tmp_path / "sweep"
    call_command(
        "simulate",
        "demo",
        "--days",
        "0.5",
        "--seed",
        "3",
        "--compare",
        "baseline",
        "spares=4",
        "--on-workers",
        "--out",
        str(out),
    )
    sim = Stored.objects.get()
    assert sim.state == "done" and sim.parts.count() == 2
    summary = json.loads((out / "summary.json").read_text())
    assert [r["name"] for r in summary] == ["baseline", "spares=4"]
    assert (out / "report.html").stat().st_size > 10_000
    assert "configuration task(s) sent" in capsys.readouterr().out


def test_the_simulate_command_on_workers_refuses_what_a_stored_simulation_cannot_hold(db, tmp_path):
    with pytest.raises(CommandError, match="preset"):
        call_command("simulate", str(tmp_path / "topology.yaml"), "--on-workers")
    with pytest.raises(CommandError, match="--workload"):
        call_command("simulate", "demo", "--on-workers", "--workload", "x.csv")
