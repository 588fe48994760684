"""Jobs that share a GPU, through the API and the database: fractions pack onto one GPU, quota
counts the fraction, and the database refuses a whole GPU on a shared one or shares past 1000."""

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from cluster.models import GPU
from scheduling.models import AllocatedGPU, Allocation, Job


def _submit(client, capture, **body):
    with capture(execute=True):
        return client.post(
            "/api/v1/jobs/", {"queue": "vision", "chip_types": ["H100-SXM"], "gpus": 1, **body}, format="json"
        )


def test_quarter_gpu_jobs_share_one_gpu_and_count_a_quarter_each(
    queues, operator_client, eager_celery, django_capture_on_commit_callbacks
):
    ids = [
        _submit(operator_client, django_capture_on_commit_callbacks, share=250).json()["id"] for _ in range(5)
    ]
    jobs = Job.objects.filter(pk__in=ids).order_by("pk")
    assert all(j.state == "running" for j in jobs)
    allocations = list(AllocatedGPU.objects.filter(job__in=jobs, active=True).order_by("job_id"))
    assert [a.share for a in allocations] == [250] * 5
    gpus = [a.gpu_id for a in allocations]
    assert len(set(gpus[:4])) == 1 and gpus[4] != gpus[0]
    queue = operator_client.get("/api/v1/queues/", {"search": "vision"}).json()["results"][0]
    usage = queue["usage"]
    h100 = next(row for row in usage if row["chip_type"] == "H100-SXM")
    assert h100["used"] == 1.25


def test_a_fraction_is_only_for_a_one_gpu_job(queues, operator_client):
    response = operator_client.post(
        "/api/v1/jobs/",
        {"queue": "vision", "chip_types": ["H100-SXM"], "gpus": 2, "share": 500},
        format="json",
    )
    assert response.status_code == 400
    assert "one-GPU jobs" in response.json()["share"][0]
    response = operator_client.post(
        "/api/v1/jobs/", {"queue": "vision", "gpus": 1, "share": 1500}, format="json"
    )
    assert response.status_code == 400 and "share" in response.json()
    assert not Job.objects.exists()


@pytest.fixture
def two_jobs(queues):
    now = timezone.now()
    a = Job.objects.create(queue=queues["vision"], gpus=1, share=600, submitted_at=now, state="running")
    b = Job.objects.create(queue=queues["vision"], gpus=1, share=500, submitted_at=now, state="running")
    c = Job.objects.create(queue=queues["vision"], gpus=1, submitted_at=now, state="running")
    return a, b, c


def test_the_database_refuses_shares_past_a_whole_gpu(two_jobs):
    a, b, _ = two_jobs
    gpu = GPU.objects.first()
    Allocation.objects.hold(a, [gpu], share=600, created_at=timezone.now())
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.hold(b, [gpu], share=500, created_at=timezone.now())
    assert AllocatedGPU.objects.filter(gpu=gpu, active=True).count() == 1


def test_the_database_refuses_a_whole_gpu_on_a_shared_one_and_the_reverse(two_jobs):
    a, _, c = two_jobs
    shared, whole = GPU.objects.all()[:2]
    Allocation.objects.hold(a, [shared], share=600, created_at=timezone.now())
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.hold(c, [shared], created_at=timezone.now())
    Allocation.objects.hold(c, [whole], created_at=timezone.now())
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.hold(a, [whole], share=300, created_at=timezone.now())


def test_released_shares_make_room_again(two_jobs):
    a, b, _ = two_jobs
    gpu = GPU.objects.first()
    first = Allocation.objects.hold(a, [gpu], share=600, created_at=timezone.now())[0]
    Allocation.objects.filter(pk=first.pk).update(active=False, released_at=timezone.now())
    Allocation.objects.hold(b, [gpu], share=500, created_at=timezone.now())
    # turning the released share back on would overfill the GPU
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.filter(pk=first.pk).update(active=True)


def test_turning_a_released_whole_gpu_back_on_over_a_share_is_refused(two_jobs):
    a, _, c = two_jobs
    gpu = GPU.objects.first()
    whole = Allocation.objects.hold(c, [gpu], created_at=timezone.now())[0]
    Allocation.objects.filter(pk=whole.pk).update(active=False, released_at=timezone.now())
    Allocation.objects.hold(a, [gpu], share=600, created_at=timezone.now())
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.filter(pk=whole.pk).update(active=True)
    assert AllocatedGPU.objects.filter(gpu=gpu, active=True).count() == 1
