"""GPU-sharing placement: capacity is never overcommitted, whole-GPU tasks never share, and the
fragmentation-aware policy keeps more of the cluster usable than best-fit and random."""

import json
from pathlib import Path

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from engine.packing import Nodes, Task, TaskMix, place, replay
from sim.openb import TraceError, load_nodes, load_tasks

DATA = Path(__file__).resolve().parent.parent / "data" / "openb"


def nodes(*gpus, cpu=64000, mem=262144, model=0):
    n = len(gpus)
    return Nodes(
        [f"n{i}" for i in range(n)],
        np.full(n, cpu),
        np.full(n, mem),
        np.array(gpus),
        np.full(n, model),
        ["G"],
    )


def test_a_fraction_goes_where_it_strands_the_least_capacity():
    cluster = nodes(1, 2)
    state = cluster.fresh_state()
    rng = np.random.default_rng(0)
    place(state, Task("a", 1000, 1000, 1, 600), "best-fit", rng)  # node 0's only GPU: 400 left
    mix = TaskMix.of([Task("m", 1000, 1000, 1, 400)])  # the workload asks for 0.4 GPUs
    frag = mix.fragmentation(state.gpu_free, state.cpu_free, state.mem_free)
    s_best, s_frag = (
        cluster.fresh_state(),
        cluster.fresh_state(),
    )
    for s in (s_best, s_frag):
        s.gpu_free[:] = state.gpu_free
    # a 0.3 task: best-fit takes the tightest GPU (node 0, leaving 100, useless for 0.4 tasks);
    # the fragmentation policy keeps node 0's 400 for a 0.4 task and uses node 1
    assert place(s_best, Task("b", 1000, 1000, 1, 300), "best-fit", rng)[0] == 0
    assert place(s_frag, Task("b", 1000, 1000, 1, 300), "fragmentation", rng, mix, frag.copy())[0] == 1


def test_whole_gpu_tasks_never_land_on_a_shared_gpu():
    state = nodes(2).fresh_state()
    rng = np.random.default_rng(0)
    place(state, Task("a", 100, 100, 1, 500), "best-fit", rng)
    assert place(state, Task("b", 100, 100, 2, 1000), "best-fit", rng) is None
    assert place(state, Task("c", 100, 100, 1, 1000), "best-fit", rng) == (0, (1,))
    assert place(state, Task("d", 100, 100, 1, 600), "best-fit", rng) is None  # 500 left on GPU 0
    state.check()


def test_cpu_and_memory_limits_count():
    state = nodes(8, cpu=4000).fresh_state()
    rng = np.random.default_rng(0)
    assert place(state, Task("a", 3000, 100, 1, 1000), "random", rng) is not None
    assert place(state, Task("b", 2000, 100, 1, 1000), "random", rng) is None  # 7 GPUs free, 1 core left
    state.check()


def test_model_constraints_are_respected():
    cluster = Nodes(
        ["a", "b"], np.full(2, 64000), np.full(2, 262144), np.array([8, 8]), np.array([0, 1]), ["T4", "V100"]
    )
    state = cluster.fresh_state()
    node, _ = place(state, Task("x", 100, 100, 1, 1000, ("V100",)), "random", np.random.default_rng(3))
    assert node == 1


@pytest.mark.parametrize("policy", ["random", "best-fit", "fragmentation"])
def test_replay_never_overcommits_and_follows_the_protocol(policy):
    cluster = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    tasks = load_tasks(DATA / "openb_pod_list_gpushare100.csv")[:1500]
    small = Nodes(
        cluster.names[:200],
        cluster.cpu[:200],
        cluster.mem[:200],
        cluster.gpus[:200],
        cluster.model[:200],
        cluster.models,
    )
    curve = replay(small, tasks, policy, target=1.3, seed=7)
    assert curve.requested[-1] >= 1.3 and np.all(np.diff(curve.requested) >= 0)
    assert np.all(curve.allocated <= curve.requested + 1e-9) and curve.allocated.max() <= 1.0
    assert np.all(np.diff(curve.allocated) >= -1e-12)  # tasks never leave


def test_fragmentation_policy_allocates_more_of_the_real_cluster():
    cluster = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    tasks = load_tasks(DATA / "openb_pod_list_default.csv")
    keep = np.arange(0, len(cluster.names), 3)  # a third of the nodes, same mix of models
    small = Nodes(
        [cluster.names[i] for i in keep],
        cluster.cpu[keep],
        cluster.mem[keep],
        cluster.gpus[keep],
        cluster.model[keep],
        cluster.models,
    )
    curves = {
        p: replay(small, tasks[:2600], p, target=1.3, seed=1) for p in ("random", "best-fit", "fragmentation")
    }
    ours = curves["fragmentation"].allocated_at(1.3)
    assert ours > curves["best-fit"].allocated_at(1.3)
    assert ours > curves["random"].allocated_at(1.3)


def test_same_seed_same_replay():
    cluster = nodes(8, 8, 4, 2)
    tasks = [Task(f"t{i}", 1000, 1000, 1, 250 + 50 * (i % 10)) for i in range(40)]
    a = replay(cluster, tasks, "random", seed=5)
    b = replay(cluster, tasks, "random", seed=5)
    assert np.array_equal(a.allocated, b.allocated)


def test_bad_trace_rows_name_the_file_line_and_column(tmp_path):
    bad = tmp_path / "tasks.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nt1,100,100,two,1000,\n")
    with pytest.raises(TraceError, match="tasks.csv line 2: column num_gpu"):
        load_tasks(bad)


def test_the_replay_command_writes_csv_and_chart(tmp_path, capsys):
    node_file = tmp_path / "nodes.csv"
    node_file.write_text("sn,cpu_milli,memory_mib,gpu,model\na,64000,262144,8,G2\nb,64000,262144,2,T4\n")
    task_file = tmp_path / "tasks.csv"
    task_file.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        + "".join(f"t{i},1000,1024,1,{300 + 100 * (i % 5)},\n" for i in range(12))
    )
    call_command("replay_openb", nodes=str(node_file), tasks=str(task_file), out=str(tmp_path / "out"))
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert set(summary) == {"random", "best-fit", "fragmentation"}
    rows = (tmp_path / "out" / "replay.csv").read_text().splitlines()
    assert rows[0] == "policy,arrival,requested_share,allocated_share" and len(rows) > 30
    html = (tmp_path / "out" / "replay.html").read_text()
    assert "Plotly.newPlot" in html and '<script src="http' not in html  # self-contained


def test_the_replay_command_refuses_an_unknown_policy(tmp_path):
    with pytest.raises(CommandError, match="--policies: unknown tetris"):
        call_command("replay_openb", policies="tetris", out=str(tmp_path))
