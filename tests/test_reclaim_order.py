"""Borrowed GPUs go home first: who is evicted when a queue reclaims, when it may, the order of
admissions inside a cycle, preempting while borrowing, and the choice between chip types; each
rule a named case in the scenario table (tests/test_engine_table.py), compared with Kueue's."""

from __future__ import annotations

import pytest

from tests.engine_helpers import cycle, layout_for, running
from tests.test_engine_table import H100, H200, Case, Run, j, q, test_scheduling_case

R = "research"
ONE_POD = {"datacenters": 1, "pods_per_dc": 1}  # 32 GPUs: nodes 0-3
ONE_DC = {"datacenters": 1}  # 64 GPUs: nodes 0-7

CASES = [
    Case(
        "1. a reclaiming queue evicts the borrower's job before its own lower-priority one",
        [
            q("a", R, nominal={H100: 32}),
            q("b", R, nominal={H100: 32}, reclaim_within_cohort="any", within_queue="lower_priority"),
        ],
        [j(1, 16, "b", priority=5)],
        running=[Run(10, "a", (0, 1, 2, 3)), Run(11, "a", (6, 7)), Run(12, "b", (4, 5))],
        cluster=ONE_DC,
        now=100,
        admitted={1: "rack"},
        victims=[11],
    ),
    Case(
        "2. a queue below its nominal quota evicts borrowers and its own lower-priority work together",
        [
            q("a", R, nominal={H100: 32}),
            q("b", R, nominal={H100: 32}, reclaim_within_cohort="any", within_queue="lower_priority"),
        ],
        [j(1, 32, "b", priority=5, topology="datacenter")],
        running=[Run(10, "a", (0, 1, 2, 3)), Run(11, "a", (4, 5)), Run(12, "b", (6, 7))],
        cluster=ONE_DC,
        now=100,
        admitted={1: "pod"},
        victims=[11, 12],
    ),
    Case(
        "3. a job within its queue's nominal quota is admitted before an earlier one that would borrow",
        [q("a", R, nominal={H100: 16}), q("b", R, nominal={H100: 16})],
        [j(1, 32, "a", t=1, topology="pod"), j(2, 16, "b", t=2, topology="pod")],
        cluster=ONE_POD,
        admitted={2: "rack"},
        reasons={1: "cohort research has 16 to lend"},
    ),
    Case(
        "4. a job that would borrow preempts nothing by default",
        [q("a", R, nominal={H100: 16}, within_queue="lower_priority"), q("b", R, nominal={H100: 16})],
        [j(1, 32, "a", priority=5, topology="pod")],
        running=[Run(10, "a", (0, 1))],
        cluster=ONE_POD,
        now=100,
        reasons={1: "would borrow"},
    ),
    Case(
        "4b. with preemption while borrowing allowed up to a priority, it preempts below it",
        [
            q("a", R, nominal={H100: 16}, within_queue="lower_priority", borrow_preempt_max_priority=0),
            q("b", R, nominal={H100: 16}),
        ],
        [j(1, 32, "a", priority=5, topology="pod")],
        running=[Run(10, "a", (0, 1))],
        cluster=ONE_POD,
        now=100,
        admitted={1: "pod"},
        victims=[10],
    ),
    Case(
        "5. a reclaim on one chip type is preferred to evicting its own work on another",
        [
            q("a", R, nominal={H100: 16, H200: 16}),
            q(
                "b",
                R,
                nominal={H100: 16, H200: 16},
                reclaim_within_cohort="any",
                within_queue="lower_priority",
            ),
        ],
        [j(1, 16, "b", priority=5, chips=(H100, H200), topology="pod")],
        running=[
            Run(10, "a", (0, 1)),
            Run(11, "b", (2, 3)),
            Run(12, "a", (4, 5, 6, 7), chip=H200),
        ],
        cluster={**ONE_POD, "chips": (H100, H200)},
        now=100,
        admitted={1: "rack"},
        victims=[12],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reclaim_case(case: Case):
    test_scheduling_case(case)


def test_the_preempted_reason_names_the_rule_that_chose_the_victim():
    case = CASES[1]
    lay = layout_for(**case.cluster)
    busy = [running(lay, r.id, r.queue, nodes=list(r.nodes)) for r in case.running]
    result, _ = cycle(lay, case.queues, busy, case.pending, now=case.now)
    reasons = {p.job_id: p.reason for p in result.preemptions}
    assert "borrowed quota goes back first" in reasons[11]
    assert "its own lower-priority work, as borrowed quota alone was not enough" in reasons[12]


def test_an_operator_allows_preempting_while_borrowing_through_the_api(queues, operator_client):
    from cluster.models import AuditRecord
    from scheduling.store import load_queues

    vision = queues["vision"]
    response = operator_client.patch(
        f"/api/v1/queues/{vision.pk}/", {"borrow_preempt_max_priority": 3}, format="json"
    )
    assert response.status_code == 200 and response.json()["borrow_preempt_max_priority"] == 3
    spec = next(q for q in load_queues() if q.name == "vision")
    assert spec.borrow_preempt_max_priority == 3
    record = AuditRecord.objects.filter(object_type="queue", object_id=vision.pk).latest("at")
    assert record.changes["borrow_preempt_max_priority"] == [None, 3]
    bad = operator_client.patch(
        f"/api/v1/queues/{vision.pk}/", {"borrow_preempt_max_priority": "x"}, format="json"
    )
    assert bad.status_code == 400 and "borrow_preempt_max_priority" in bad.json()
