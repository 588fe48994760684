"""A queue pointed at a cohort (or checkpoint policy) that another request deletes meanwhile: a 400
naming the field, or the queue left without it, never a 500 (found by the fuzzing of the API,
two workers at once on PostgreSQL)."""

import threading
import time

import pytest
from django.db import IntegrityError, connection, transaction

from cluster.api.errors import exception_handler
from scheduling.api.queue_serializers import QueueSerializer
from scheduling.models import CheckpointPolicy, Cohort, Queue
from scheduling.services import delete_locked, save_queue


def _joining(queue, **data):
    serializer = QueueSerializer(queue, data=data, partial=True)
    serializer.is_valid(raise_exception=True)
    return serializer


def test_a_cohort_deleted_after_the_request_was_validated_is_a_400_naming_the_field(queues, operator):
    from rest_framework.exceptions import ValidationError

    Cohort.objects.create(name="short-lived")
    CheckpointPolicy.objects.create(name="gone-soon", interval_s=600)
    legacy = queues["legacy"]
    for field, value, model in (
        ("cohort", "short-lived", Cohort),
        ("default_checkpoint_policy", "gone-soon", CheckpointPolicy),
    ):
        serializer = _joining(legacy, **{field: value})  # valid when read
        model.objects.filter(name=value).delete()  # deleted before the write
        with pytest.raises(ValidationError) as refused:
            save_queue(serializer, actor=operator)
        assert field in refused.value.detail and "was deleted while this request ran" in str(
            refused.value.detail
        )
        legacy.refresh_from_db()
        assert getattr(legacy, f"{field}_id") is None  # nothing written


def test_a_constraint_the_database_finds_at_commit_is_a_409_not_a_500():
    response = exception_handler(IntegrityError("insert or update violates foreign key constraint"), {})
    assert response.status_code == 409 and "nothing was written" in response.data["detail"]


def _waiting_on_a_lock(seconds: float = 10.0) -> bool:
    """Whether another session of this database waits on a row lock (within ``seconds``)."""
    end = time.monotonic() + seconds
    with connection.cursor() as cursor:
        while time.monotonic() < end:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                return True
            time.sleep(0.02)
    return False


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_cohort_deleted_while_a_queue_joins_it_waits_and_leaves_the_queue_without_it(queues, operator):
    cohort = Cohort.objects.create(name="short-lived")
    legacy = queues["legacy"]
    saved, release = threading.Event(), threading.Event()
    errors: list[Exception] = []

    def join():
        try:
            with transaction.atomic():  # the request's transaction: it commits after the delete began
                save_queue(_joining(legacy, cohort="short-lived"), actor=operator)
                saved.set()
                release.wait(10)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            saved.set()
            connection.close()

    def delete():
        saved.wait(10)
        try:
            delete_locked(Cohort.objects.get(pk=cohort.pk))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=join), threading.Thread(target=delete)]
    for t in threads:
        t.start()
    saved.wait(10)
    blocked = _waiting_on_a_lock()  # the delete waits for the queue's write to commit
    release.set()
    for t in threads:
        t.join(20)
    assert blocked and errors == []
    legacy = Queue.objects.get(pk=legacy.pk)
    assert legacy.cohort_id is None and not Cohort.objects.filter(pk=cohort.pk).exists()
