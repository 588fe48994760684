"""Mixed-chip gangs in the scheduling cycle: split over allowed chip types inside one domain when
no single type can hold them, each type within its quota; evicting one gives back every part."""

from __future__ import annotations

from engine.workload import PendingJob, QueueSpec
from tests.engine_helpers import cycle, domains_of, layout_for

H100, H200 = "H100-SXM", "H200"


def lay():
    # 2 datacenters, each with one H100 pod and one H200 pod of 32 GPUs
    return layout_for(pods_per_dc=1, chips=(H100, H200))


def gang(job_id, gpus, mixed=True, topology="datacenter", **kw):
    return PendingJob(
        job_id,
        "a",
        gpus,
        chip_types=(H100, H200),
        topology=topology,
        submitted_at=job_id,
        mixed=mixed,
        **kw,
    )


def test_a_gang_too_big_for_one_chip_type_is_split_inside_one_datacenter():
    layout = lay()
    q = QueueSpec("a", nominal={H100: 1000, H200: 1000})
    result, after = cycle(layout, [q], [], [gang(1, 48)])
    (a,) = result.admissions
    assert dict(a.parts) == {H100: 32, H200: 16}  # the preferred type first
    assert len(domains_of(layout, a.held, "datacenter")) == 1


def test_without_opting_in_it_waits_with_a_reason():
    result, _ = cycle(
        lay(), [QueueSpec("a", nominal={H100: 1000, H200: 1000})], [], [gang(1, 48, mixed=False)]
    )
    assert not result.admissions
    assert "no datacenter with 48 free H100-SXM" in result.pending[1]


def test_each_part_stays_within_its_chip_quota():
    q = QueueSpec("a", nominal={H100: 16, H200: 1000})
    result, _ = cycle(lay(), [q], [], [gang(1, 48)])
    assert dict(result.admissions[0].parts) == {H100: 16, H200: 32}


def test_a_job_one_type_can_hold_is_not_split():
    result, _ = cycle(lay(), [QueueSpec("a", nominal={H100: 1000, H200: 1000})], [], [gang(1, 24)])
    assert not result.admissions[0].parts


def test_evicting_a_mixed_job_gives_back_both_parts():
    layout = layout_for(pods_per_dc=1, chips=(H100, H200), datacenters=1)  # 32 H100 + 32 H200
    q = QueueSpec("a", nominal={H100: 64, H200: 40}, within_queue="lower_priority")
    first, after = cycle(layout, [q], [], [gang(1, 48)])
    assert dict(first.admissions[0].parts) == {H100: 32, H200: 16}
    urgent = PendingJob(2, "a", 32, priority=5, chip_types=(H200,), topology="datacenter", submitted_at=9)
    # 16 H200 are free and the quota allows 24 more: only evicting the mixed job makes room and quota
    result, after = cycle(layout, [q], after, [urgent], now=10)
    assert [p.job_id for p in result.preemptions] == [1]
    assert [a.job_id for a in result.admissions] == [2]
    assert [j.id for j in after] == [2]


def test_a_mixed_gang_across_datacenters_takes_its_share_of_the_link_and_waits_when_it_is_full():
    from engine.sites import SiteLink, SiteLinks

    def book(load=0.0):
        links = SiteLinks([SiteLink(0, 1, 8, 400.0, 0.25, name="dc1<->dc2")])
        if load:
            links.add((0, 1), load)
        return links

    layout = lay()  # 64 GPUs a datacenter, 64 of each type: 96 fit neither one type nor one site
    q = QueueSpec("a", nominal={H100: 1000, H200: 1000})
    wide = gang(1, 96, topology="region")
    result, _ = cycle(layout, [q], [], [wide], links=book())
    (a,) = result.admissions
    assert sum(n for _, n in a.parts) == 96 and len(domains_of(layout, a.held, "datacenter")) == 2
    ((pair, load),) = a.link_loads  # the gradients of a 70B model over the ring, per step
    assert pair == (0, 1) and 0 < load <= 0.9 * 8 * 400e9 / 8
    # a link at its share has no room: the gang does not cross it
    full, _ = cycle(layout, [q], [], [wide], links=book(load=0.9 * 8 * 400e9 / 8))
    assert full.admissions == [] and 1 in full.pending
    # without a site model (no links known) it crosses as before, taking no share
    blind, _ = cycle(layout, [q], [], [wide])
    (b,) = blind.admissions
    assert b.link_loads == ()


def test_a_mixed_gang_spans_datacenters_only_when_it_pays_and_otherwise_waits_for_one():
    """A mixed-chip split across datacenters gets the span-or-wait decision single-type gangs get:
    waiting for one datacenter to hold it on one chip type against the mixed plan's slowdown over
    the link, with both numbers in its reason or admission note."""
    from engine.scheduler import SchedulerConfig
    from engine.sites import SiteLink, SiteLinks

    layout = layout_for(pods_per_dc=2, chips=(H100, H200))  # per datacenter 64 H100 + 64 H200
    by_dc_chip = {}  # (datacenter, chip type) -> its GPUs
    for g, node in enumerate(layout.gpu_node.tolist()):
        key = (int(layout.node_domain[3][node]), layout.topo.chip_names[layout.node_chip[node]])
        by_dc_chip.setdefault(key, []).append(g)

    def busy(h200_ends_at=None, h100_ends_at=None):
        from tests.engine_helpers import running

        return [
            running(layout, 101, "a", gpus=by_dc_chip[(0, H100)][:40], end=h100_ends_at),  # 24 H100 free
            running(layout, 102, "a", gpus=by_dc_chip[(0, H200)], chip=H200, end=h200_ends_at),
            running(layout, 103, "a", gpus=by_dc_chip[(1, H100)]),  # no estimated end
            running(layout, 104, "a", gpus=by_dc_chip[(1, H200)][:40], chip=H200),  # dc2: 24 H200 free
        ]

    def links():
        return SiteLinks([SiteLink(0, 1, 8, 400.0, 0.25, name="dc1<->dc2")])

    q = QueueSpec("a", nominal={H100: 1000, H200: 1000})
    wide = gang(1, 48, topology="region", estimated_duration_s=30 * 3600.0)
    # 48 GPUs fit only as 24 H100 in dc1 + 24 H200 in dc2; dc1 holds 48 H200 once job 102 ends
    soon, _ = cycle(layout, [q], busy(h200_ends_at=600.0), [wide], links=links())
    assert soon.admissions == []
    why = soon.pending[1]
    assert "waits for dc1 on H200 (about 10 min) rather than span dc1+dc2" in why
    assert "% slower" in why and [r.job_id for r in soon.reservations] == [1]
    # H100s in dc1 free up later than its H200s: it reserves on the type it weighed, the soonest
    both, _ = cycle(layout, [q], busy(h200_ends_at=600.0, h100_ends_at=5 * 3600.0), [wide], links=links())
    assert "waiting for reservation: 48 H200 GPUs in datacenter dc1" in both.pending[1]
    assert "waits for dc1 on H200 (about 10 min)" in both.pending[1]
    late, _ = cycle(layout, [q], busy(h200_ends_at=100 * 3600.0), [wide], links=links())
    (a,) = late.admissions
    assert dict(a.parts) == {H100: 24, H200: 24} and len(domains_of(layout, a.held, "datacenter")) == 2
    assert a.span_note.startswith("spans dc1+dc2 over dc1<->dc2: ")
    assert "0.9% slower" in a.span_note
    assert "starts now instead of in about 4.2 d in dc1 on H200" in a.span_note
    assert "24 H100-SXM + 24 H200" in a.span_note and "GPUs: 24 in dc1, 24 in dc2" in a.span_note
    assert a.span_slowdown > 0 and a.link_loads
    # spanning whenever no datacenter holds it: no wait weighed
    config = SchedulerConfig(span_policy="whenever")
    anyway, _ = cycle(layout, [q], busy(h200_ends_at=600.0), [wide], links=links(), config=config)
    assert "(policy whenever)" in anyway.admissions[0].span_note
    # waiting only for 48 H100 in dc1: half of the split on H200 runs faster than that, so it spans
    faster, _ = cycle(layout, [q], busy(h100_ends_at=600.0), [wide], links=links())
    (f,) = faster.admissions
    assert "% faster (-" in f.span_note and "instead of in about 10 min in dc1 on H100-SXM" in f.span_note
    assert f.span_slowdown == 0.0


def test_a_mixed_gang_waits_for_a_split_inside_one_datacenter_and_holds_it():
    """No type alone ever holds the gang in one datacenter, but both together in dc1 will in a
    minute: it waits for that split (weighed against the same split inside one datacenter) and
    reserves it over both types, so that nobody else takes the room it waits for."""
    from engine.sites import SiteLink, SiteLinks
    from tests.engine_helpers import running

    layout = layout_for(pods_per_dc=2, chips=(H100, H200))  # per datacenter 64 H100 + 64 H200
    by_dc_chip = {}
    for g, node in enumerate(layout.gpu_node.tolist()):
        key = (int(layout.node_domain[3][node]), layout.topo.chip_names[layout.node_chip[node]])
        by_dc_chip.setdefault(key, []).append(g)
    busy = [
        running(layout, 101, "a", gpus=by_dc_chip[(0, H100)][:40]),  # dc1: 24 H100 free
        running(layout, 102, "a", gpus=by_dc_chip[(0, H200)][:40], chip=H200, end=60.0),
        running(layout, 103, "a", gpus=by_dc_chip[(0, H200)][40:], chip=H200),  # dc1: 40 H200 in 1 min
        running(layout, 104, "a", gpus=by_dc_chip[(1, H100)]),
        running(layout, 105, "a", gpus=by_dc_chip[(1, H200)][:40], chip=H200),  # dc2: 24 H200 free
    ]
    links = SiteLinks([SiteLink(0, 1, 1, 10.0, 0.25, name="dc1<->dc2")])  # a thin link: 10 Gb/s
    q = QueueSpec("a", nominal={H100: 1000, H200: 1000})
    from engine.steptime import ModelSpec

    model = ModelSpec.from_dict(
        {"params": 13e9, "layers": 40, "hidden": 5120, "seq_len": 2048, "batch_tokens": 256 * 2048}
    )  # its activations at a pipeline split take seconds of a 10 Gb/s link per step
    wide = gang(1, 48, topology="region", estimated_duration_s=30 * 3600.0, model=model)
    result, _ = cycle(layout, [q], busy, [wide], links=links)
    assert result.admissions == []
    why = result.pending[1]
    assert "waits for dc1 as 24 H100-SXM + 24 H200 (about 1 min) rather than span dc1+dc2" in why
    assert why.startswith("waiting for reservation: 48 H100-SXM+H200 GPUs in datacenter dc1")
    (r,) = result.reservations
    assert len(domains_of(layout, r.held, "datacenter")) == 1 and len(r.held) == 48
    # a later one-type job that would take that room in dc1 does not (it would run past the start)
    other = PendingJob(2, "a", 24, chip_types=(H100,), topology="datacenter", submitted_at=2)
    later, _ = cycle(layout, [q], busy, [wide, other], links=links)
    assert later.admissions == [] and "free only on GPUs reserved for a larger job" in later.pending[2]
