"""Spanning datacenters only when it pays, within the links' capacity (engine.sites, no database)."""

from __future__ import annotations

import pytest

from engine.linkreplan import move_seconds, replan
from engine.physics import Physics
from engine.scheduler_config import SchedulerConfig
from engine.sites import (
    SiteLink,
    SiteLinks,
    decide,
    default_latency_ms,
    link_state,
    min_latency_ms,
    one_site_step_s,
    ring,
    shrink_or_span,
    span_cost,
)
from engine.steptime import MODELS, ModelSpec
from engine.workload import PendingJob, QueueSpec
from tests.engine_helpers import cycle, domains_of, layout_for, running

HOUR = 3600.0


def queue():
    return QueueSpec("a", nominal={"H100-SXM": 10_000})


def links(lanes=8, lost=0, down=False, load=0.0):
    book = SiteLinks([SiteLink(0, 1, lanes, 400.0, 0.25, lanes_lost=lost, down=down, name="dc1<->dc2")])
    if load:
        book.add((0, 1), load)
    return book


def half_busy(lay, end_dc1, end_dc2):
    """Half of each datacenter (64 GPUs each) busy until the given times."""
    return [
        running(lay, 100, "a", nodes=(0, 1, 2, 3), end=end_dc1),
        running(lay, 101, "a", nodes=(8, 9, 10, 11), end=end_dc2),
    ]


def big(job_id=1, gpus=64, hours=100.0, **kw):
    return PendingJob(job_id, "a", gpus, topology="region", estimated_duration_s=hours * HOUR, **kw)


def test_a_link_has_a_state_a_capacity_and_a_fibre_latency():
    assert default_latency_ms(40) == pytest.approx(0.2)  # 5 us per km
    assert min_latency_ms(100) == pytest.approx(0.49)
    assert link_state(8, 0, False) == "up"
    assert link_state(8, 3, False) == "degraded"
    assert link_state(8, 8, False) == "down" and link_state(8, 0, True) == "down"
    link = SiteLink(0, 1, 8, 400.0, 0.2, lanes_lost=2)
    assert link.capacity_bytes == 6 * 400e9 / 8
    assert SiteLink(0, 1, 8, 400.0, 0.2, down=True).capacity_bytes == 0
    assert ring((0, 1)) == [(0, 1)]
    assert sorted(ring((0, 1, 2))) == [(0, 1), (0, 2), (1, 2)]


def test_the_cost_of_spanning_keeps_whole_parts_in_each_site_and_grows_as_the_link_thins():
    model = MODELS["llama3-405b"]
    wide = span_cost(model, "H100-SXM", {0: 2048, 1: 2048}, links(lanes=32))
    thin = span_cost(model, "H100-SXM", {0: 2048, 1: 2048}, links(lanes=1))
    assert 0 < wide.slowdown < thin.slowdown
    for cost in (wide, thin):
        tp, pp, dp = (int(x[2:]) for x in cost.plan.split())
        if cost.cut == "replicas":  # every replica lives wholly in one datacenter
            assert dp >= 2 and 2048 % (tp * pp) == 0 and sum(n for _, n in cost.stages) == dp
        else:  # every datacenter holds whole pipeline stages of every replica
            assert cost.cut == "stages" and sum(n for _, n in cost.stages) == pp
            assert all(n >= 1 and n * tp * dp <= 2048 for _, n in cost.stages)
        ((pair, load),) = cost.loads
        assert pair == (0, 1) and 0 < load <= 0.9 * (32 if cost is wide else 1) * 400e9 / 8
    # a link at its share, or down, has no room: spanning it is not possible
    assert span_cost(model, "H100-SXM", {0: 2048, 1: 2048}, links(load=0.9 * 8 * 400e9 / 8)) is None
    assert span_cost(model, "H100-SXM", {0: 2048, 1: 2048}, links(down=True)) is None


def test_the_pipeline_cut_at_the_link_wins_where_it_is_faster_and_whole_replicas_where_it_is_lighter():
    # GPT-3-shaped 177B, 3M-token steps (the published cross-site runs). Over 120 km at 800 Gb/s
    # the gradients' all-reduce across is partly exposed while the sends at a pipeline cut overlap
    # the steps: the cut is faster by more than 1%. Over 500 km at 3.2 Tb/s both are within 1% of
    # each other and whole replicas take less of the link, which other jobs share.
    gpt = ModelSpec(177e9, 96, 12288, 2048, 1536 * 2048, "177b")
    thin = SiteLinks([SiteLink(0, 1, 2, 400.0, default_latency_ms(120))])
    cut = span_cost(gpt, "A100-80G", {0: 768, 1: 256}, thin)
    whole = span_cost(gpt, "A100-80G", {0: 768, 1: 256}, thin, ("replicas",))
    assert cut.cut == "stages" and 0.95 < 1 / (1 + cut.slowdown) < 1.0
    assert cut.span_step_s < whole.span_step_s / 1.01
    tp, pp, dp = (int(x[2:]) for x in cut.plan.split())
    (_, n_a), (_, n_b) = cut.stages
    assert n_a + n_b == pp and n_a == 3 * n_b  # stages in proportion to the GPUs: 768 against 256
    assert cut.layout({0: "bj1", 1: "sh1"}).endswith(f"stages 1-{n_a} in bj1, {n_a + 1}-{pp} in sh1")
    ((_, load),) = cut.loads
    assert 0 < load <= 0.9 * 2 * 400e9 / 8
    far = SiteLinks([SiteLink(0, 1, 8, 400.0, default_latency_ms(500))])
    near_tie = span_cost(gpt, "A100-80G", {0: 768, 1: 256}, far)
    faster = span_cost(gpt, "A100-80G", {0: 768, 1: 256}, far, ("stages",))
    assert (
        near_tie.cut == "replicas" and faster.span_step_s <= near_tie.span_step_s <= faster.span_step_s * 1.01
    )
    assert near_tie.loads[0][1] < faster.loads[0][1]
    llama = span_cost(MODELS["llama3-70b"], "H100-SXM", {0: 4096, 1: 4096}, far)
    assert llama.cut == "replicas"
    assert llama.layout({0: "bj1", 1: "sh1"}).endswith("replicas: 64 in bj1, 64 in sh1")


def test_a_short_wait_beats_spanning_and_the_reason_gives_both_numbers():
    lay = layout_for()  # two datacenters of 64 GPUs
    result, _ = cycle(lay, [queue()], half_busy(lay, 30.0, 10 * HOUR), [big()], links=links(lanes=1))
    assert result.admissions == []
    (reservation,) = result.reservations
    assert domains_of(lay, reservation.held, "datacenter") == {0}
    reason = result.pending[1]
    assert "waits for dc1 (about 30 s) rather than span dc1+dc2" in reason
    assert "% slower (+" in reason and "over 4.2 d" in reason


def test_a_gang_that_waits_rather_than_span_reserves_even_past_the_limit_on_reservations():
    # with no reservations allowed at all, a gang that could span but waits for dc1 still holds
    # the room its wait was weighed on; a gang that may not span gets none (the limit holds)
    lay = layout_for()
    config = SchedulerConfig(max_reservations=0)
    busy = half_busy(lay, 30.0, 10 * HOUR)
    inside = PendingJob(2, "a", 64, topology="datacenter", estimated_duration_s=HOUR, submitted_at=2)
    result, _ = cycle(lay, [queue()], busy, [big(), inside], links=links(lanes=1), config=config)
    assert result.admissions == []
    (reservation,) = result.reservations
    assert reservation.job_id == 1 and domains_of(lay, reservation.held, "datacenter") == {0}
    assert "waits for dc1 (about 30 s) rather than span" in result.pending[1]


def test_a_long_wait_makes_spanning_pay_and_the_job_takes_its_share_of_the_link():
    lay = layout_for()
    book = links()
    result, _ = cycle(lay, [queue()], half_busy(lay, 10 * HOUR, 10 * HOUR), [big()], links=book)
    (a,) = result.admissions
    assert domains_of(lay, a.held, "datacenter") == {0, 1}
    assert a.span_note.startswith("spans dc1+dc2 over dc1<->dc2: ")
    assert "starts now instead of in about 10.0 h in dc" in a.span_note
    ((pair, load),) = a.link_loads
    assert pair == (0, 1) and load > 0
    assert book.load == {}  # the caller's book is not changed; it adds the admission's loads


def test_without_any_estimate_the_job_spans_and_says_why():
    lay = layout_for()
    result, _ = cycle(lay, [queue()], half_busy(lay, None, None), [big()], links=links())
    (a,) = result.admissions
    assert "no datacenter has an estimated time to hold it" in a.span_note


@pytest.mark.parametrize("book", [links(down=True), links(load=0.9 * 8 * 400e9 / 8)], ids=["down", "full"])
def test_a_link_down_or_full_keeps_the_job_inside_one_datacenter(book):
    lay = layout_for()
    result, _ = cycle(lay, [queue()], half_busy(lay, 10 * HOUR, 20 * HOUR), [big()], links=book)
    assert result.admissions == []
    assert "no link between the datacenters it would span has room left" in result.pending[1]
    (reservation,) = result.reservations
    assert domains_of(lay, reservation.held, "datacenter") == {0}


def test_the_policies_never_and_whenever():
    lay = layout_for()
    busy = half_busy(lay, 30.0, 10 * HOUR)
    never, _ = cycle(
        lay, [queue()], busy, [big()], links=links(), config=SchedulerConfig(span_policy="never")
    )
    assert never.admissions == [] and "datacenter" in never.pending[1]
    assert domains_of(lay, never.reservations[0].held, "datacenter") == {0}
    whenever, _ = cycle(
        lay, [queue()], busy, [big()], links=links(), config=SchedulerConfig(span_policy="whenever")
    )
    (a,) = whenever.admissions
    assert "(policy whenever); TP" in a.span_note and domains_of(lay, a.held, "datacenter") == {0, 1}


def test_a_job_one_datacenter_holds_never_spans():
    lay = layout_for()
    result, _ = cycle(lay, [queue()], [], [big(gpus=48)], links=links())
    (a,) = result.admissions
    assert a.span_note == "" and a.link_loads == () and len(domains_of(lay, a.held, "datacenter")) == 1


def test_decide_weighs_the_wait_against_the_time_lost():
    cost = span_cost(None, "H100-SXM", {0: 512, 1: 512}, links(lanes=1))
    lost = cost.slowdown * 10 * HOUR
    names = {0: "bj1", 1: "sh1"}
    assert decide(cost, names, lost * 2, "bj1", 10 * HOUR).span
    assert not decide(cost, names, lost * 1.05, "bj1", 10 * HOUR).span  # inside the 10% margin
    assert decide(cost, names, lost * 1.05, "bj1", 10 * HOUR, margin=0.0).span


def test_the_simulator_runs_the_same_rule_over_its_links():
    from sim.config import SimConfig
    from sim.simulation import Simulation
    from sim.workload import SimJob

    lay = layout_for()  # two datacenters of 64 H100s
    jobs = [SimJob(1, "a", 96, 0.0, 3600.0, "H100-SXM", topology="region", parameters=8e9)]
    queues = [queue()]
    config = SimConfig(days=1, seed=1, check_invariants=True)
    spanned = Simulation(lay.topo, jobs, config, queues=queues, site_links=links())
    taken = []
    original = spanned._start

    def start(job, held, *, resumed, **kw):
        taken.append(dict(spanned.sites.shares))
        original(job, held, resumed=resumed, **kw)

    spanned._start = start
    out = spanned.run()
    assert taken and taken[0][1][0][0] == (0, 1)  # it crossed the link with its modelled share
    assert spanned.sites.shares == {}  # and gave the share back when it ended
    cut = Simulation(lay.topo, jobs, config, queues=queues, site_links=links(down=True)).run()
    assert out["jobs"]["ended_by_outcome"] == {"completed": 1}
    assert out["sites"]["spanned_jobs"] == 1 and out["sites"]["busiest_link"] == "dc1<->dc2"
    assert 0.99 < out["sites"]["crossing_gpu_hours_share"] <= 1.0  # its only job ran across
    # its steps are slower across the link, and slower still over a thinner one
    thin = Simulation(lay.topo, jobs, config, queues=queues, site_links=links(lanes=1))
    thin.run()
    assert thin.jobs[1].ended > spanned.jobs[1].ended > 3600.0
    assert cut["jobs"]["started"] == 0 and cut["jobs"]["pending_at_end"] == 1  # no link: it never runs


def test_a_spanning_job_restarted_in_place_after_a_fault_stays_slower_across_the_link():
    from sim.config import SimConfig
    from sim.simulation import Simulation
    from sim.workload import SimJob

    lay = layout_for()  # two datacenters of 64 H100s
    jobs = [SimJob(1, "a", 96, 0.0, 10 * HOUR, "H100-SXM", topology="region", parameters=8e9)]
    sim = Simulation(lay.topo, jobs, SimConfig(days=1, seed=1), queues=[queue()], site_links=links())
    sim.arrive_and_schedule(1)
    job = sim.jobs[1]
    assert job.slowdown > 0 and job.overhead >= job.slowdown / (1 + job.slowdown)
    before = job.overhead
    sim.now = HOUR
    node = int(lay.topo.gpu_node[job.held[0]])
    sim.inject(node, "xid", 43)  # an application fault: the job restarts in place
    assert sim.recoveries[-1][1] == "restart_in_place" and 1 in sim.running
    assert job.overhead == pytest.approx(before)  # still across the link, still that much slower


def test_a_partitioned_datacenter_takes_nothing_new_and_its_work_keeps_running():
    lay = layout_for()
    inside = running(lay, 100, "a", nodes=(0, 1), end=None)
    cut = [True, False]  # dc1 cannot be reached
    result, after = cycle(
        lay, [queue()], [inside], [big(1, gpus=16), big(2, gpus=64, hours=1)], unreachable=cut
    )
    (a,) = result.admissions
    assert a.job_id == 1 and domains_of(lay, a.held, "datacenter") == {1}
    assert 2 in result.pending  # 64 GPUs would fit dc1, which is out of reach, or span it: neither
    assert result.preemptions == [] and any(j.id == 100 for j in after)


def test_the_simulator_at_100k_places_nothing_in_a_partitioned_campus():
    from engine.chips import BY_NAME
    from engine.presets import preset_document
    from engine.sites import links_from_spec
    from engine.synthetic import snapshot_from_spec
    from engine.topology_spec import parse_topology
    from sim.config import SimConfig
    from sim.simulation import Simulation
    from sim.workload import generate

    spec = parse_topology(preset_document("100k"), set(BY_NAME))
    topo = snapshot_from_spec(spec)
    cut, start, end = 2, 6 * HOUR, 12 * HOUR  # bj3, from 06:00 to 12:00
    config = SimConfig(days=1, seed=3, partitions=((cut, start, end),))
    sim = Simulation(
        topo, generate(topo.count_by_chip(), 1, seed=3), config, site_links=links_from_spec(spec)
    )
    dc_of = sim.layout.node_domain[3][sim.layout.gpu_node]
    starts, original = [], sim._start

    def start_job(job, held, *, resumed, **kw):
        starts.append((sim.now, set(dc_of[held].tolist())))
        original(job, held, resumed=resumed, **kw)

    sim._start = start_job
    sim.run()
    before = [d for t, d in starts if t < start]
    during = [d for t, d in starts if start <= t < end]
    after = [d for t, d in starts if t >= end]
    assert any(cut in d for d in before) and any(cut in d for d in after)
    assert during and not any(cut in d for d in during)


def test_what_if_configurations_sweep_the_span_policy_the_margin_and_the_links(tmp_path):
    import json

    from monitoring.whatif.simreport import parse_config, run_all

    assert parse_config("span=never,margin=0.3,links=0.5") == {
        "name": "span=never,margin=0.3,links=0.5",
        "span": "never",
        "margin": 0.3,
        "links": 0.5,
    }
    with pytest.raises(ValueError, match="bad value for span: 'sometimes'"):
        parse_config("span=sometimes")
    pod = {"chip_type": "H100-SXM", "racks": 2, "nodes_per_rack": 4, "gpus_per_node": 8}
    doc = {
        "regions": [{"name": "r", "datacenters": [{"name": f"dc{i}", "pods": [pod]} for i in (1, 2)]}],
        "links": [{"between": ["dc1", "dc2"], "distance_km": 50, "lanes": 8}],
    }
    # one gang of 96 GPUs: no datacenter of 64 ever holds it
    workload = tmp_path / "one.json"
    row = {"arrival_s": 0, "gpus": 96, "work_s": 3600, "chip": "H100-SXM", "topology": "region"}
    workload.write_text(json.dumps([{**row, "parameters": 8e9}]))
    configs = [parse_config(c) for c in ("span=never", "span=whenever", "span=whenever,links=0.5")]
    never, whenever, thin = run_all(doc, configs, days=1, seed=2, jobs=None, workload=str(workload))
    assert never["sites"]["spanned_jobs"] == 0 and never["completion"]["completed"] == 0
    assert whenever["sites"]["spanned_jobs"] == 1 and whenever["completion"]["completed"] == 1
    assert whenever["sites"]["busiest_link"] == "dc1<->dc2"
    # at half the link's rate the same share is a larger part of its capacity
    # over links at half their rate the same gang runs no faster (its plan may change: at half the
    # rate cutting the pipeline at the link beats sending the gradients across)
    assert thin["completion"]["mean_jct_s"] >= whenever["completion"]["mean_jct_s"]


def test_a_job_slowed_past_the_threshold_moves_or_shrinks_only_when_that_finishes_sooner():
    week = 7 * 86400.0
    assert replan(0.15, week, move_s=600, move_to="bj1").action == "stay"  # within 20%
    moved = replan(0.3, week, move_s=600, move_to="bj1")
    assert moved.action == "move" and moved.finish_s == week + 600
    assert (
        "30.0% slower across the link" in moved.note
        and "moves into bj1 (the move costs 10 min)" in moved.note
    )
    # an hour of work left loses 1,080 s across the link: a 1,200 s move does not pay, 1,000 s does
    assert replan(0.3, 3600, move_s=1000, move_to="bj1").action == "move"
    assert replan(0.3, 3600, move_s=1200, move_to="bj1").action == "stay"
    stuck = replan(0.3, week)
    assert stuck.action == "stay" and "no datacenter holds it now" in stuck.note
    # elastic: at 70% of its throughput in one datacenter beats 1/1.5 = 67% across the link
    assert replan(0.5, week, shrink_speed=0.7, shrink_gpus=32).action == "shrink"
    stays = replan(0.3, week, shrink_speed=0.7, shrink_gpus=32)
    assert stays.action == "stay" and "shrinking to its 32 GPUs in one datacenter would take" in stays.note


def test_a_move_costs_a_save_a_restart_and_a_restore_or_the_unsaved_work():
    saving = move_seconds(1024, 1e12, unsaved_s=3600, saves=True)
    losing = move_seconds(1024, 1e12, unsaved_s=3600, saves=False)
    assert 0 < saving < losing and losing - saving == pytest.approx(
        3600 - 1e12 / (Physics().storage_gbps(1024) * 1e9)
    )


def test_an_elastic_job_spans_only_when_it_runs_faster_than_the_size_one_datacenter_holds():
    links = SiteLinks([SiteLink(0, 1, 32, 400, 0.3)])
    cost = span_cost(MODELS["llama3-8b"], "H100-SXM", {0: 256, 1: 256}, links)
    one_512 = one_site_step_s(MODELS["llama3-8b"], "H100-SXM", 512)
    one_256 = one_site_step_s(MODELS["llama3-8b"], "H100-SXM", 256)
    spans = shrink_or_span(cost, 512, {0: "bj1", 1: "bj2"}, one_256, 256, links=links)
    assert spans.span and "x the throughput of the 256 GPUs one datacenter holds now" in spans.note
    # one datacenter holds nearly all of it: spanning for a few more GPUs does not pay the margin
    near = shrink_or_span(cost, 512, {0: "bj1", 1: "bj2"}, one_512 * 1.05, 496, links=links)
    assert not near.span and near.note.startswith(
        "runs at the 496 GPUs one datacenter holds rather than span"
    )
