from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from cluster.api.authentication import NodePrincipal
from cluster.roles import is_operator, is_viewer


class RolePermission(BasePermission):
    """Viewers read; operators also write and take actions. Anonymous requests get 401."""

    message = "Your role does not allow this; operators may change inventory, viewers may only read."

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not user or not user.is_authenticated:
            return False
        if request.method in SAFE_METHODS:
            return is_viewer(user)
        return is_operator(user)


def node_of(request):
    """The node a request's node credential is bound to, or None for any other caller."""

    user = getattr(request, "user", None)
    return user.node if isinstance(user, NodePrincipal) else None


class IsNodeAgent(BasePermission):
    """Only a node's agent, with its node credential: it reports for and reads its own node only."""

    message = "Only a node's agent, with its node credential, may call this."

    def has_permission(self, request, view) -> bool:
        return node_of(request) is not None
