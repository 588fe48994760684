"""Job arrays: one submit of many jobs that differ by index, a running limit the engine keeps,
and the array cancelled, held and released as one or an index at a time."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from engine import arrays
from engine.workload import PendingJob, QueueSpec
from scheduling.cycle import run_cycle
from scheduling.models import Allocation, Job, JobArray, JobEvent
from tests.engine_helpers import cycle, layout_for

H100 = "H100-SXM"


# --- the engine ---------------------------------------------------------------------------------
def test_the_engine_starts_no_more_of_an_array_than_its_limit():
    lay = layout_for()
    queue = QueueSpec("a", nominal={H100: 1000})
    pending = [
        PendingJob(i, "a", 1, chip_types=(H100,), submitted_at=i, array=7, array_limit=3) for i in range(10)
    ]
    pending.append(PendingJob(99, "a", 1, chip_types=(H100,), submitted_at=99))  # not in the array
    result, after = cycle(lay, [queue], [], pending)
    assert sorted(a.job_id for a in result.admissions) == [0, 1, 2, 99]
    waiting = result.pending[5]
    assert waiting.kind == "array" and waiting.facts == {"array": 7, "max_running": 3}
    assert "array 7 runs 3 jobs at once" in waiting
    # the next cycle sees the three running and starts none; one ending lets exactly one start
    rest = [j for j in pending if j.id not in (0, 1, 2, 99)]
    result, _ = cycle(lay, [queue], after, rest)
    assert result.admissions == []
    result, _ = cycle(lay, [queue], [r for r in after if r.id != 1], rest)
    assert [a.job_id for a in result.admissions] == [3]


def test_an_array_shares_its_queue_fairly_with_single_jobs():
    lay = layout_for(pods_per_dc=1, racks=1, nodes_per_rack=2, datacenters=1)  # 16 GPUs
    queues = [QueueSpec("a", cohort="c", nominal={H100: 8}), QueueSpec("b", cohort="c", nominal={H100: 8})]
    sweep = [PendingJob(i, "a", 1, chip_types=(H100,), submitted_at=0, array=1) for i in range(40)]
    singles = [PendingJob(100 + i, "b", 1, chip_types=(H100,), submitted_at=1 + i) for i in range(8)]
    result, _ = cycle(lay, queues, [], sweep + singles)
    admitted = [a.job_id for a in result.admissions]
    assert len(admitted) == 16
    assert sum(1 for j in admitted if j >= 100) == 8  # queue b's own quota, not taken by the array


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9-3", "ends before it starts"),
        ("0-9%0", "running limit after %"),
        ("a-b", "is not an index"),
        ("0-5,3", "index 3 is given more than once"),
        ("0-200000", "more than 100,000 indices"),
        ("", "give the indices"),
    ],
)
def test_a_bad_array_is_refused_naming_the_field(text, message):
    with pytest.raises(arrays.ArrayError) as exc:
        arrays.parse(text)
    assert exc.value.field == "array" and message in exc.value.message


def test_array_syntax_follows_slurm():
    spec = arrays.parse("0-6:3,10,20-21%2")
    assert spec.indices.tolist() == [0, 3, 6, 10, 20, 21] and spec.max_running == 2 and spec.size == 6


# --- through the API ----------------------------------------------------------------------------
def submit_array(client, capture, spec, **body):
    with capture(execute=True):
        return client.post(
            "/api/v1/jobs/",
            {"queue": "vision", "chip_types": [H100], "gpus": 1, "array": spec, **body},
            format="json",
        )


def test_one_submit_makes_an_array_whose_limit_the_cycle_keeps(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    response = submit_array(operator_client, django_capture_on_commit_callbacks, "0-9%3", name="sweep")
    assert response.status_code == 201, response.json()
    array = response.json()
    assert array["size"] == 10 and array["max_running"] == 3 and array["spec"] == "0-9%3"
    assert response["Location"] == f"/api/v1/arrays/{array['id']}/"
    jobs = Job.objects.filter(array_id=array["id"]).order_by("array_index")
    assert [j.array_index for j in jobs] == list(range(10)) and {j.name for j in jobs} == {"sweep"}
    assert JobEvent.objects.filter(job__array_id=array["id"], kind="submitted").count() == 10
    assert Job.objects.filter(array_id=array["id"], state="running").count() == 3  # the triggered cycle
    waiting = Job.objects.filter(array_id=array["id"], state="pending").first()
    assert waiting.pending_kind == "array" and "its %3 limit" in waiting.pending_reason
    listed = operator_client.get("/api/v1/jobs/", {"array": array["id"], "state": "running"}).json()
    assert listed["count"] == 3 and all(j["array_id"] == array["id"] for j in listed["results"])
    detail = operator_client.get(f"/api/v1/arrays/{array['id']}/").json()
    assert detail["states"]["running"] == 3 and detail["states"]["pending"] == 7
    page = operator_client.get("/api/v1/arrays/").json()
    assert page["results"][0]["states"] == detail["states"]
    # the pages: the jobs list of one array, and the array on a job's page
    operator_client.force_login(User.objects.get(username="otto-operator"))
    html = operator_client.get("/jobs/", {"array": array["id"], "state": "all"}).content.decode()
    assert "10 jobs · page 1" in html and "0-9%3: 10 jobs, at most 3 running at once" in html
    assert "0 jobs · page 1" in operator_client.get("/jobs/", {"array": 99999}).content.decode()
    html = operator_client.get(f"/jobs/{waiting.pk}/").content.decode()
    assert f"Index {waiting.array_index} of job array" in html and "sweep" in html


def test_an_array_past_the_cycles_window_starts_whole_without_waiting_for_beat(
    queues, operator_client, settings, eager_celery, django_capture_on_commit_callbacks
):
    """A cycle reads only an array's first MYRIAD_CYCLE_MAX_STARTS pending jobs: one that starts
    them all sees nothing left, yet the rest of the array is there, so the next cycle follows."""
    settings.CYCLE_MAX_STARTS = 3
    response = submit_array(operator_client, django_capture_on_commit_callbacks, "0-6", name="sweep")
    assert response.status_code == 201, response.json()
    jobs = Job.objects.filter(array_id=response.json()["id"])
    assert jobs.filter(state="running").count() == 7 and not jobs.filter(state="pending").exists()


def test_cancelling_one_running_index_frees_its_gpus_and_the_next_index_starts(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    array = submit_array(operator_client, django_capture_on_commit_callbacks, "0-5%2").json()
    first = Job.objects.get(array_id=array["id"], array_index=0)
    assert first.state == "running"
    with django_capture_on_commit_callbacks(execute=True):
        answer = operator_client.post(
            f"/api/v1/arrays/{array['id']}/cancel/", {"indices": "0"}, format="json"
        )
    assert answer.status_code == 200 and answer.json()["changed"] == 1
    first.refresh_from_db()
    assert first.state == "cancelled" and first.finished_at is not None
    assert not Allocation.objects.filter(job=first, active=True).exists()
    running = Job.objects.filter(array_id=array["id"], state="running")
    assert sorted(running.values_list("array_index", flat=True)) == [1, 2]
    assert JobEvent.objects.filter(job=first, kind="cancelled").count() == 1


def test_hold_keeps_pending_indices_waiting_and_release_lets_them_run(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    array = submit_array(operator_client, django_capture_on_commit_callbacks, "0-49").json()
    url = f"/api/v1/arrays/{array['id']}/"
    # 32 of vision's own and 16 more borrowed from nlp's idle quota: 48 GPUs, 48 run
    assert Job.objects.filter(array_id=array["id"], state="running").count() == 48
    held = operator_client.post(url + "hold/", {"reason": "bad data in shard 7"}, format="json").json()
    assert held["changed"] == 2 and held["array"]["states"]["suspended"] == 2
    assert held["array"]["states"]["running"] == 48  # running ones run on, as Slurm's hold
    with django_capture_on_commit_callbacks(execute=True):
        operator_client.post(url + "cancel/", {"indices": "0-9"}, format="json")
    states = operator_client.get(url).json()["states"]
    assert (
        states["suspended"] == 2 and states["running"] == 38 and states["cancelled"] == 10
    )  # held: none start
    with django_capture_on_commit_callbacks(execute=True):
        released = operator_client.post(url + "release/", {"indices": "48-49"}, format="json").json()
    assert released["changed"] == 2 and released["array"]["states"]["pending"] == 2
    assert operator_client.get(url).json()["states"]["running"] == 40  # the cycle after it started them
    with django_capture_on_commit_callbacks(execute=True):
        everything = operator_client.post(url + "cancel/", {}, format="json").json()
    assert everything["changed"] == 40 and everything["array"]["states"]["cancelled"] == 50
    assert not Allocation.objects.filter(job__array_id=array["id"], active=True).exists()


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"array": "5-1"}, "array", "ends before it starts"),
        ({"array": "0-3%x"}, "array", "running limit"),
        ({"array": "0-9", "gpus": 10_000}, "gpus", "the cluster has only 48 GPUs"),
        ({"array": "0-11"}, "array", "more than 10 indices"),
    ],
)
def test_a_bad_array_submit_is_a_400_naming_the_field_and_writes_nothing(
    queues, operator_client, settings, body, field, message
):
    settings.ARRAY_MAX_SIZE = 10
    response = operator_client.post(
        "/api/v1/jobs/", {"queue": "vision", "chip_types": [H100], "gpus": 1, **body}, format="json"
    )
    assert response.status_code == 400 and message in response.json()[field][0], response.json()
    assert not JobArray.objects.exists() and not Job.objects.exists() and not JobEvent.objects.exists()


def test_an_action_on_an_index_the_array_lacks_changes_nothing(
    queues, operator_client, django_capture_on_commit_callbacks
):
    array = submit_array(operator_client, django_capture_on_commit_callbacks, "0-3").json()
    answer = operator_client.post(f"/api/v1/arrays/{array['id']}/cancel/", {"indices": "2-8"}, format="json")
    assert answer.status_code == 400 and "index 4 is not in this array" in answer.json()["indices"][0]
    assert not Job.objects.filter(state="cancelled").exists()


def test_viewers_see_arrays_but_cannot_submit_or_act(
    queues, operator_client, viewer_client, django_capture_on_commit_callbacks
):
    array = submit_array(operator_client, django_capture_on_commit_callbacks, "0-3").json()
    assert viewer_client.get(f"/api/v1/arrays/{array['id']}/").status_code == 200
    assert viewer_client.post(f"/api/v1/arrays/{array['id']}/hold/", {}, format="json").status_code == 403
    refused = viewer_client.post(
        "/api/v1/jobs/", {"queue": "vision", "gpus": 1, "array": "0-3"}, format="json"
    )
    assert refused.status_code == 403 and JobArray.objects.count() == 1


def test_a_10000_job_array_is_one_request_written_in_bulk(
    queues, operator_client, django_capture_on_commit_callbacks, django_assert_max_num_queries
):
    with django_assert_max_num_queries(25):  # no statement per job: the count does not grow with N
        response = submit_array(operator_client, django_capture_on_commit_callbacks, "0-9999%500")
    assert response.status_code == 201 and response.json()["size"] == 10_000
    assert Job.objects.filter(array_id=response.json()["id"]).count() == 10_000
    assert JobEvent.objects.filter(kind="submitted").count() == 10_000
    run_cycle()
    assert Job.objects.filter(state="running").count() == 48  # the cluster's GPUs, under the limit
