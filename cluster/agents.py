"""Node agents' enrolment and credentials.

An operator makes a one-time enrolment token (admin, API or ``manage.py enrolment_token``); a
node's agent trades it for a node credential bound to one node: the token's node, or the node
whose hostname the agent reports. Tokens and credentials are random 32-byte secrets stored only
as SHA-256 digests (a secret this long needs no slow hash); the secret is shown once. A node has
at most one live credential (a database constraint): enrolling again revokes the old one.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from cluster.audit import record
from cluster.models import EnrolmentToken, Node, NodeCredential
from cluster.ports import set_ports

TOKEN_PREFIX = "myr-enrol-"
CREDENTIAL_PREFIX = "myr-node-"
DEFAULT_TOKEN_TTL_S = 24 * 3600
MAX_TOKEN_TTL_S = 30 * 24 * 3600


UNKNOWN_CREDENTIAL = "Unknown node credential."
REVOKED_CREDENTIAL = "This node credential was revoked; enrol the node again."


class EnrolmentError(ValueError):
    """A refused enrolment; ``field`` names what is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _secret(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def create_enrolment_token(
    *, actor: str, node: Node | None = None, ttl_s: int = DEFAULT_TOKEN_TTL_S
) -> tuple[EnrolmentToken, str]:
    """A new one-time token (and its secret, shown only now), audited."""
    if not 60 <= ttl_s <= MAX_TOKEN_TTL_S:
        raise EnrolmentError("ttl_s", f"must be between 60 and {MAX_TOKEN_TTL_S} seconds, not {ttl_s}")
    secret = _secret(TOKEN_PREFIX)
    with transaction.atomic():
        token = EnrolmentToken.objects.create(
            key_hash=digest(secret),
            prefix=secret[len(TOKEN_PREFIX) : len(TOKEN_PREFIX) + 6],
            node=node,
            created_by=actor,
            expires_at=timezone.now() + timedelta(seconds=ttl_s),
        )
        target = str(node) if node else "the node named by the agent's hostname"
        record(actor, "create", "enrolment token", token, {"node": [None, target]})
    return token, secret


def enrol(
    token_secret: str,
    *,
    hostname: str,
    address: str = "",
    agent_version: str = "",
    gpus: int | None = None,
    ports: list[dict] | None = None,
) -> tuple[NodeCredential, str]:
    """Trade a one-time token for a credential of its node (or of the node named ``hostname``).
    Returns the credential and its secret; refuses a used, expired or unknown token. ``ports``
    (checked by ``cluster.ports.parse_inventory``) becomes the node's port list."""
    now = timezone.now()
    with transaction.atomic():
        token = (
            EnrolmentToken.objects.select_for_update(of=("self",))
            .select_related("node")
            .filter(key_hash=digest(token_secret or ""))
            .first()
        )
        if token is None:
            raise EnrolmentError("token", "unknown enrolment token")
        if token.used_at is not None:
            raise EnrolmentError("token", f"this token was used at {token.used_at:%Y-%m-%d %H:%M:%S} UTC")
        if token.expires_at <= now:
            raise EnrolmentError("token", f"this token expired at {token.expires_at:%Y-%m-%d %H:%M:%S} UTC")
        node = token.node
        if node is None:
            node = Node.objects.filter(hostname=hostname).first()
            if node is None:
                raise EnrolmentError("hostname", f"no node {hostname!r} in the inventory; add it first")
        if gpus is not None and gpus != node.gpus_per_node:
            raise EnrolmentError(
                "gpus",
                f"this machine has {gpus} GPUs; node {node} is in the inventory with {node.gpus_per_node}",
            )
        revoked = NodeCredential.objects.filter(node=node, revoked_at__isnull=True).update(
            revoked_at=now, revoked_by="enrolled again"
        )
        secret = _secret(CREDENTIAL_PREFIX)
        try:
            credential = NodeCredential.objects.create(
                node=node,
                key_hash=digest(secret),
                prefix=secret[len(CREDENTIAL_PREFIX) : len(CREDENTIAL_PREFIX) + 6],
                address=address or node.hostname,
                agent_version=agent_version[:32],
            )
        except IntegrityError as exc:  # another enrolment of this node won the race
            raise EnrolmentError("token", "the node is being enrolled by another agent") from exc
        token.used_at, token.used_for = now, node
        token.save(update_fields=["used_at", "used_for"])
        if ports is not None:
            set_ports(node.pk, ports)
        record(
            "agent", "enrol", "node", node, {"credential": [None, credential.prefix]}, f"{revoked} revoked"
        )
    return credential, secret


def revoke(credential: NodeCredential, *, actor: str, reason: str = "") -> NodeCredential:
    """Revoke a credential: the node's agent is refused from its next request on."""
    if credential.revoked_at is None:
        with transaction.atomic():
            credential.revoked_at, credential.revoked_by = timezone.now(), actor
            credential.save(update_fields=["revoked_at", "revoked_by"])
            record(
                actor, "revoke", "node", credential.node, {"credential": [credential.prefix, None]}, reason
            )
    return credential


def credential_for(secret: str) -> NodeCredential | None:
    """The credential with this secret (and its node), revoked or not, or None."""
    if not secret.startswith(CREDENTIAL_PREFIX):
        return None
    return NodeCredential.objects.select_related("node").filter(key_hash=digest(secret)).first()


def agent_node_ids() -> set[int]:
    """Nodes run by an agent (a live credential): the simulated fleet leaves them alone."""
    return set(NodeCredential.objects.filter(revoked_at__isnull=True).values_list("node_id", flat=True))
