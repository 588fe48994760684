"""A large gang does not starve behind a stream of small jobs; invariants hold for random inputs."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.scheduler import SchedulerConfig
from engine.workload import PendingJob, QueueSpec, RunningJob
from tests.engine_helpers import cycle, layout_for

H100 = "H100-SXM"


def _run_stream(config: SchedulerConfig, horizon: float = 1500.0) -> float | None:
    """2,048-GPU cluster full of 8-GPU jobs; a 2,048-GPU gang arrives at t=0 and ten 8-GPU jobs
    arrive every 10 s. Returns when the gang started, or None if it never did."""
    lay = layout_for(datacenters=1, pods_per_dc=4, racks=8, nodes_per_rack=8)  # 2,048 GPUs
    rng = np.random.default_rng(7)
    queues = [QueueSpec("a", nominal={H100: 100_000})]
    running = []
    from engine.workload import RunningJob

    for n in range(lay.topo.num_nodes):
        start = lay.node_gpu_start[n]
        end = float(rng.uniform(100, 1000))
        running.append(RunningJob(10_000 + n, "a", np.arange(start, start + 8), H100, 0, 0.0, end, 0.0))
    pending = [PendingJob(1, "a", 2048, chip_types=(H100,), submitted_at=0.0, estimated_duration_s=3600)]
    next_id = 2
    t = 0.0
    while t <= horizon:
        running = [j for j in running if j.estimated_end is None or j.estimated_end > t]
        for _ in range(10):
            pending.append(
                PendingJob(next_id, "a", 8, chip_types=(H100,), submitted_at=t, estimated_duration_s=600)
            )
            next_id += 1
        result, running = cycle(lay, queues, running, pending, now=t, config=config)
        started = {a.job_id for a in result.admissions}
        if 1 in started:
            return t
        pending = [j for j in pending if j.id not in started]
        t += 10.0
    return None


def test_a_2048_gpu_gang_starts_once_the_running_jobs_end():
    started = _run_stream(SchedulerConfig())
    assert started is not None and started <= 1010  # the initial jobs all end by t=1000


def test_without_reservations_the_same_gang_starves():
    assert _run_stream(SchedulerConfig(max_reservations=0)) is None


# --- properties -------------------------------------------------------------------------------------
job_strategy = st.tuples(
    st.integers(1, 40),  # GPUs
    st.integers(0, 3),  # priority
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["node", "rack", "pod", "datacenter", "any"]),
    st.one_of(st.none(), st.integers(10, 2000)),
    st.sampled_from([(H100,), ("A100-80G",), (H100, "A100-80G")]),
    st.booleans(),  # elastic: may run at half its size, so a later job may shrink it
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(job_strategy, min_size=1, max_size=30),
    nominal=st.tuples(st.integers(0, 64), st.integers(0, 64), st.integers(0, 64)),
    limits=st.tuples(st.one_of(st.none(), st.integers(0, 32)), st.one_of(st.none(), st.integers(0, 32))),
    policies=st.tuples(
        st.sampled_from(["never", "lower_priority", "any"]), st.sampled_from(["never", "lower_priority"])
    ),
    cordoned=st.sets(st.integers(0, 15), max_size=4),
    rounds=st.integers(1, 4),
)
def test_invariants_hold_over_successive_cycles(jobs, nominal, limits, policies, cordoned, rounds):
    lay = layout_for(datacenters=2, pods_per_dc=1, racks=2, nodes_per_rack=2, chips=(H100, "A100-80G"))
    for node in cordoned:
        lay.topo.node_state[node % lay.topo.num_nodes] = 1
    queues = [
        QueueSpec(
            "a",
            "co",
            priority=0,
            nominal={H100: nominal[0], "A100-80G": nominal[0] // 2},
            borrowing_limit={H100: limits[0]},
            reclaim_within_cohort=policies[0],
            within_queue=policies[1],
        ),
        QueueSpec(
            "b",
            "co",
            nominal={H100: nominal[1], "A100-80G": nominal[1]},
            lending_limit={H100: limits[1]},
            reclaim_within_cohort="any",
            within_queue="lower_priority",
        ),
        QueueSpec("c", None, nominal={H100: nominal[2], "A100-80G": nominal[2]}),
    ]
    pending = [
        PendingJob(
            i + 1,
            q,
            g,
            priority=p,
            chip_types=chips,
            topology=topo,
            submitted_at=float(i),
            estimated_duration_s=None if d is None else float(d),
            min_gpus=g // 2 if elastic and g >= 2 else None,
        )
        for i, (g, p, q, topo, d, chips, elastic) in enumerate(jobs)
    ]
    specs = {j.id: j for j in pending}
    running: list = []
    now = 0.0
    for _ in range(rounds):
        result, running = cycle(lay, queues, running, pending, now=now)
        done = {a.job_id for a in result.admissions}
        # admitted jobs leave the queue; victims go back to it as they were submitted
        pending = [j for j in pending if j.id not in done] + [specs[p.job_id] for p in result.preemptions]
        now += 500.0
        running = [j for j in running if j.estimated_end is None or j.estimated_end > now]


def test_invariants_hold_in_full_cohorts_where_jobs_evict_and_shrink_each_other():
    """Seeded random cohorts on a nearly full cluster: queues that lend and reclaim, priorities,
    elastic jobs running and pending, several cycles each. Every cycle passes the invariant
    checker (no GPU held twice, victims and shrunk jobs give back exactly what they held, quota
    kept), and the runs really do evict and shrink, several in one cycle."""
    lay = layout_for(datacenters=2, pods_per_dc=2, racks=2, nodes_per_rack=4, chips=(H100, "A100-80G"))
    topo = lay.topo
    chips = list(topo.chip_names)
    capacity = {c: int(np.count_nonzero(topo.gpu_chip == i)) for i, c in enumerate(chips)}
    evicted = shrunk = busiest = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        queues = [
            QueueSpec(
                f"q{i}",
                "co" if i < 3 else None,
                nominal={c: int(capacity[c] * rng.uniform(0.1, 0.5)) for c in chips},
                reclaim_within_cohort=str(rng.choice(["never", "lower_priority", "any"])),
                within_queue=str(rng.choice(["never", "lower_priority"])),
                borrow_preempt_max_priority=None if rng.random() < 0.5 else int(rng.integers(0, 5)),
            )
            for i in range(4)
        ]
        running = []
        for jid, node in enumerate(rng.permutation(topo.num_nodes)[: int(topo.num_nodes * 0.85)].tolist()):
            start = lay.node_gpu_start[node]
            elastic = rng.random() < 0.4
            running.append(
                RunningJob(
                    jid + 1,
                    f"q{int(rng.integers(4))}",
                    np.arange(start, start + 8),
                    chips[topo.node_chip[node]],
                    int(rng.integers(0, 6)),
                    float(rng.uniform(0, 3000)),
                    90_000.0,
                    float(rng.uniform(0, 3000)) if rng.random() < 0.5 else None,
                    min_gpus=4 if elastic else None,
                    max_gpus=8 if elastic else None,
                )
            )
        pending = []
        for k in range(int(rng.integers(40, 120))):
            gpus = int(rng.choice([1, 2, 4, 8, 16, 32]))
            pending.append(
                PendingJob(
                    1_000 + k,
                    f"q{int(rng.integers(4))}",
                    gpus,
                    chip_types=(chips[int(rng.integers(len(chips)))],),
                    priority=int(rng.integers(0, 8)),
                    submitted_at=float(k),
                    estimated_duration_s=float(rng.uniform(600, 36_000)),
                    min_gpus=gpus // 2 if gpus >= 8 and rng.random() < 0.3 else None,
                    topology=str(rng.choice(["any", "datacenter", "pod"])),
                )
            )
        specs = {j.id: j for j in pending}
        now = 3600.0
        for _ in range(3):
            result, running = cycle(lay, queues, running, pending, now=now)
            evicted += len(result.preemptions)
            shrunk += len(result.resizes)
            busiest = max(busiest, len(result.preemptions) + len(result.resizes))
            started = {a.job_id for a in result.admissions}
            pending = [j for j in pending if j.id not in started]
            pending += [specs[p.job_id] for p in result.preemptions if p.job_id in specs]
            now += 600.0
    assert evicted >= 50 and shrunk >= 20 and busiest >= 5, (evicted, shrunk, busiest)
