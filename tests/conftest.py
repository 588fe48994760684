"""Shared fixtures: personas (anonymous, viewer, operator) and a small cluster.

Tests run on the embedded default (SQLite) and, when MYRIAD_DATABASE_URL / MYRIAD_REDIS_URL
are set, against the real PostgreSQL and Redis; tests that need those are marked and skipped
on the embedded default.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from cluster.builder import build_cluster, known_chip_names
from engine.topology_spec import parse_topology
from scheduling.models import Job

SMALL_TOPOLOGY = {
    "regions": [
        {
            "name": "north",
            "datacenters": [
                {
                    "name": "dc1",
                    "location": "Beijing",
                    "power_budget_kw": 1000,
                    "pods": [
                        {
                            "chip_type": "H100-SXM",
                            "count": 2,
                            "racks": 2,
                            "nodes_per_rack": 2,
                            "gpus_per_node": 8,
                            "spare_nodes": 1,
                        },
                    ],
                },
                {
                    "name": "dc2",
                    "pods": [
                        {
                            "name": "a100",
                            "chip_type": "A100-80G",
                            "racks": 1,
                            "nodes_per_rack": 3,
                            "gpus_per_node": 4,
                        }
                    ],
                },
            ],
        }
    ],
    "links": [{"between": ["dc1", "dc2"], "distance_km": 40, "bandwidth_gbps": 3200}],
}


# Tests that start a whole stack, real servers or agents: under pytest-xdist (`make test` runs two
# processes) they run one after another in one process, so two stacks never share a Redis database,
# a copied PostgreSQL database or the machine's two cores, and each module starts its stack once;
# the rest run beside them, one test at a time to whichever process is free.
ONE_AT_A_TIME = {
    "test_browser.py",
    "test_real_nodes.py",
    "test_multi_process.py",
    "test_own_faults.py",
    "test_prometheus.py",
    "test_live_dashboard.py",
    "test_scheduling_concurrency.py",
}


def work_unit(nodeid: str) -> str:
    """The unit a parallel run hands to one process: every stack test together, else the test."""
    return "stacks" if nodeid.split("::", 1)[0].rsplit("/", 1)[-1] in ONE_AT_A_TIME else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Units by ``work_unit``. (xdist's own loadgroup marks a test's group by rewriting its node id,
    which this pytest no longer lets it do: every stack test went to either process.)"""
    from xdist.scheduler import LoadScopeScheduling

    class StacksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return StacksTogether(config, log)


def pytest_collection_modifyitems(config, items):
    on_postgres = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
    skip_pg = pytest.mark.skip(reason="needs PostgreSQL: set MYRIAD_DATABASE_URL")
    skip_redis = pytest.mark.skip(reason="needs Redis: set MYRIAD_REDIS_URL")
    for item in items:
        if "postgres" in item.keywords and not on_postgres:
            item.add_marker(skip_pg)
        if "redis" in item.keywords and not settings.REDIS_URL:
            item.add_marker(skip_redis)


@pytest.fixture(autouse=True)
def fresh_throttles():
    """Each test starts with no failed logins or submits counted (cluster.api.throttling)."""
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture(autouse=True)
def no_cycle_requested():
    """Each test starts with no scheduling cycle marked as requested: a marker an earlier test left
    (its cycle task queued and never run) would make this test's requests wait behind it."""
    from scheduling.trigger import clear_requested

    clear_requested()
    yield
    clear_requested()


@pytest.fixture(autouse=True)
def fresh_topology_cache():
    """Each test builds its own cluster: never reuse a snapshot cached by an earlier test."""
    from cluster.snapshot import topology_cache
    from scheduling.cycle import reset_caches

    topology_cache.reset()
    reset_caches()
    yield
    topology_cache.reset()
    reset_caches()


@pytest.fixture
def small_cluster(db):
    return build_cluster(parse_topology(SMALL_TOPOLOGY, known_chip_names()))


def _user(username: str, group: str | None, **flags) -> User:
    user = User.objects.create_user(username=username, password="pw", **flags)
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


@pytest.fixture
def viewer(db) -> User:
    return _user("vera-viewer", "viewer")


@pytest.fixture
def operator(db) -> User:
    return _user("otto-operator", "operator", is_staff=True)


@pytest.fixture
def outsider(db) -> User:
    return _user("nora-norole", None)


@pytest.fixture
def anonymous_client() -> APIClient:
    return APIClient()


@pytest.fixture
def viewer_client(viewer) -> APIClient:
    client = APIClient()
    client.force_authenticate(viewer)
    return client


@pytest.fixture
def operator_client(operator) -> APIClient:
    client = APIClient()
    client.force_authenticate(operator)
    return client


@pytest.fixture
def eager_celery():
    """Run Celery tasks inline (the worker itself is tested in test_scheduling_worker)."""
    from config.celery import app

    previous = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True  # a failing task fails the test
    yield app
    app.conf.task_always_eager, app.conf.task_eager_propagates = previous


@pytest.fixture
def queues(small_cluster):
    """Cohort 'research' with queues 'vision' (32 H100) and 'nlp' (32 H100, reclaims any);
    queue 'legacy' (12 A100, no cohort)."""
    from cluster.models import ChipType
    from scheduling.models import Cohort, Queue, QueueQuota

    h100 = ChipType.objects.get(name="H100-SXM")
    a100 = ChipType.objects.get(name="A100-80G")
    research = Cohort.objects.create(name="research")
    vision = Queue.objects.create(name="vision", cohort=research, priority=0)
    nlp = Queue.objects.create(name="nlp", cohort=research, priority=0, reclaim_within_cohort="any")
    legacy = Queue.objects.create(name="legacy")
    QueueQuota.objects.create(queue=vision, chip_type=h100, nominal=32)
    QueueQuota.objects.create(queue=nlp, chip_type=h100, nominal=32)
    QueueQuota.objects.create(queue=legacy, chip_type=a100, nominal=12)
    return {"vision": vision, "nlp": nlp, "legacy": legacy}


@pytest.fixture
def colocation(small_cluster):
    """Cohort colo: serving (32 H100, reclaims anything) and training (16 H100, borrows)."""
    from cluster.models import ChipType
    from scheduling.models import Cohort, InferenceService, Queue, QueueQuota

    h100 = ChipType.objects.get(name="H100-SXM")
    colo = Cohort.objects.create(name="colo")
    serving = Queue.objects.create(name="serving", cohort=colo, priority=100, reclaim_within_cohort="any")
    training = Queue.objects.create(name="training", cohort=colo)
    QueueQuota.objects.create(queue=serving, chip_type=h100, nominal=32)
    QueueQuota.objects.create(queue=training, chip_type=h100, nominal=16)
    service = InferenceService.objects.create(
        name="chat",
        queue=serving,
        chip_types=["H100-SXM"],
        replica_gpus=8,
        capacity_rps=100,
        headroom=0,
        min_replicas=1,
        max_replicas=4,
        scale_down_delay_s=300,
        load_profile={"kind": "diurnal", "trough_rps": 50, "peak_rps": 350, "peak_hour": 14},
    )
    return service


@pytest.fixture
def running_job(queues, operator_client, eager_celery, django_capture_on_commit_callbacks):
    """An 8-GPU job running on dc1-p01-r01-n01 (the best fit for one node)."""
    with django_capture_on_commit_callbacks(execute=True):
        body = {
            "queue": "vision",
            "gpus": 8,
            "chip_types": ["H100-SXM"],
            "topology": "node",
            "parameters": 7e9,
        }
        job_id = operator_client.post("/api/v1/jobs/", body, format="json").json()["id"]
    job = Job.objects.get(pk=job_id)
    assert job.state == "running"
    return job
