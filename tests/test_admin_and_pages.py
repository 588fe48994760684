"""Django admin and the inventory page as an operator uses them."""

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from cluster.models import GPU, Node


@pytest.fixture
def admin_client_logged_in(db):
    user = User.objects.create_superuser("ada-admin", "ada@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    "model", ["chiptype", "region", "datacenter", "datacenterlink", "pod", "rack", "node", "gpu", "nicport"]
)
def test_every_inventory_changelist_opens(small_cluster, admin_client_logged_in, model):
    response = admin_client_logged_in.get(reverse(f"admin:cluster_{model}_changelist"))
    assert response.status_code == 200


def test_rack_and_pod_lists_show_gpu_counts(small_cluster, admin_client_logged_in):
    page = admin_client_logged_in.get(reverse("admin:cluster_pod_changelist")).content.decode()
    assert '<td class="field-gpu_count">32</td>' in page and '<td class="field-gpu_count">12</td>' in page
    page = admin_client_logged_in.get(reverse("admin:cluster_rack_changelist")).content.decode()
    assert page.count('<td class="field-gpu_count">16</td>') == 4


def test_gpu_list_filters_by_datacenter_and_state(small_cluster, admin_client_logged_in):
    GPU.objects.filter(node__hostname="dc2-a100-r01-n01").update(state="down")
    url = reverse("admin:cluster_gpu_changelist")
    response = admin_client_logged_in.get(url, {"state__exact": "down"})
    assert sorted(str(g) for g in response.context["cl"].result_list) == [
        f"dc2-a100-r01-n01/gpu{i}" for i in range(4)
    ]
    dc2 = Node.objects.get(hostname="dc2-a100-r01-n01").rack.pod.datacenter_id
    response = admin_client_logged_in.get(url, {"node__rack__pod__datacenter__id__exact": dc2})
    assert response.context["cl"].result_count == 12


def test_gpu_list_pages_instead_of_loading_every_gpu(
    small_cluster, admin_client_logged_in, django_assert_max_num_queries
):
    with django_assert_max_num_queries(12):
        response = admin_client_logged_in.get(reverse("admin:cluster_gpu_changelist"), {"p": 0})
    assert len(response.context["cl"].result_list) <= 100


def test_bulk_cordon_and_mark_spare(small_cluster, admin_client_logged_in):
    ids = list(Node.objects.filter(rack__pod__name="p01").values_list("pk", flat=True))
    url = reverse("admin:cluster_node_changelist")
    admin_client_logged_in.post(url, {"action": "cordon_nodes", "_selected_action": ids})
    assert set(Node.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"cordoned"}
    assert Node.objects.filter(pk__in=ids).first().state_reason == "cordon by ada-admin: admin bulk action"
    admin_client_logged_in.post(url, {"action": "mark_spare", "_selected_action": ids})
    assert Node.objects.filter(pk__in=ids, is_spare=True).count() == len(ids)


def test_bulk_action_is_all_or_nothing(small_cluster, admin_client_logged_in):
    nodes = list(Node.objects.order_by("pk")[:3])
    Node.objects.filter(pk=nodes[0].pk).update(state="down")
    url = reverse("admin:cluster_node_changelist")
    response = admin_client_logged_in.post(
        url, {"action": "cordon_nodes", "_selected_action": [n.pk for n in nodes]}, follow=True
    )
    assert "Nothing changed" in response.content.decode()
    assert list(
        Node.objects.filter(pk__in=[n.pk for n in nodes]).order_by("pk").values_list("state", flat=True)
    ) == ["down", "ready", "ready"]


def test_inventory_page_needs_a_login_and_a_role(small_cluster, viewer, outsider):
    client = Client()
    assert client.get("/").status_code == 302
    client.force_login(outsider)
    assert client.get("/").status_code == 403
    client.force_login(viewer)
    page = client.get("/").content.decode()
    assert '<span class="num" id="total-gpus">76</span>' in page
    assert "A100-80G" in page and "H100-SXM" in page


def test_login_page_logs_in(small_cluster, viewer):
    client = Client()
    response = client.post("/accounts/login/", {"username": viewer.username, "password": "pw"}, follow=True)
    assert response.status_code == 200 and "vera-viewer" in response.content.decode()
    bad = Client().post("/accounts/login/", {"username": viewer.username, "password": "nope"})
    assert "Wrong username or password" in bad.content.decode()


def test_create_login_prints_a_working_token(db, capsys):
    from django.core.management import call_command
    from rest_framework.test import APIClient

    call_command("create_login", "ops", "--role", "operator")
    out = capsys.readouterr().out
    token = out.split("api_token=")[1].strip()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/v1/nodes/").status_code == 200
    password = out.split("password=")[1].split()[0]
    assert Client().login(username="ops", password=password)
