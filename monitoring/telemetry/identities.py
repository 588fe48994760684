"""Who sent a report: the node credential named by ``Authorization: Node <credential>``, read
once and cached per process (a credential's node never changes); a revoked one is refused at once
because every report's own update checks it (``monitoring.telemetry.ingest``), which then forgets it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from cluster.agents import CREDENTIAL_PREFIX, REVOKED_CREDENTIAL, UNKNOWN_CREDENTIAL, digest
from cluster.models import Node, NodeCredential


@dataclass(frozen=True)
class Identity:
    """Who a node credential is: which never changes, so it is cached; whether it is still live
    is checked by the report's own update (monitoring.telemetry.ingest), so a revoked one is
    refused at once."""

    credential_id: int
    node_id: int
    hostname: str
    gpus_per_node: int


class Refused(Exception):
    def __init__(self, status: int, payload: dict):
        super().__init__(payload)
        self.status, self.payload = status, payload


NOT_A_NODE = "Only a node's agent, with its node credential, may call this."
_identities: dict[str, Identity] = {}


def identity_for(authorization: str, db: bool = True) -> Identity | None:
    """The live credential named by an ``Authorization: Node <credential>`` header; with
    ``db=False`` None when reading it would need the database (not cached yet)."""
    scheme, _, secret = authorization.strip().partition(" ")
    if not scheme:
        raise Refused(401, {"detail": "Authentication credentials were not provided."})
    if scheme.lower() != "node":
        raise Refused(403, {"detail": NOT_A_NODE})
    secret = secret.strip()
    if not secret.startswith(CREDENTIAL_PREFIX):
        raise Refused(401, {"detail": UNKNOWN_CREDENTIAL})
    key = digest(secret)
    found = _identities.get(key)
    if found is not None or not db:
        return found
    if not _identities:  # a process's first report: every live credential in one query
        for row in _read_identities("c.revoked_at IS NULL", []):
            _identities[row[0]] = Identity(*row[1:5])
        found = _identities.get(key)
        if found is not None:
            return found
    row = next(iter(_read_identities("c.key_hash = %s", [key])), None)
    if row is None:
        raise Refused(401, {"detail": UNKNOWN_CREDENTIAL})
    if row[5]:
        raise revoked()
    found = _identities[key] = Identity(*row[1:5])
    return found


def _read_identities(where: str, params: list) -> list[tuple]:
    c, n = NodeCredential._meta.db_table, Node._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.key_hash, c.id, c.node_id, n.hostname, n.gpus_per_node, c.revoked_at IS NOT NULL "
            f"FROM {c} c JOIN {n} n ON n.id = c.node_id WHERE {where}",
            params,
        )
        return cursor.fetchall()


def forget(identity: Identity) -> None:
    for key, value in list(_identities.items()):
        if value == identity:
            del _identities[key]


def revoked() -> Refused:
    return Refused(401, {"detail": REVOKED_CREDENTIAL})
