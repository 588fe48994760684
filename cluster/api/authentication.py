"""API token authentication in one query.

DRF's TokenAuthentication reads the token and its user through the ORM, and the role check then
reads the user's groups: two queries and about a millisecond of query building on every request,
which is a quarter of a job submission. This class answers the same way (the same user, the same
token object, the same errors) from one plain SQL statement that also returns the user's group
names, so the role check needs no query of its own.

A token found is remembered by the web process for TOKEN_MEMO_S (1 s): a pipeline submitting
hundreds of jobs a second sends the same token each time. A change to a user, its groups or its
tokens made through this process forgets every remembered token at once (``forget_tokens``, on
the models' signals); one made elsewhere (another web process, a bulk update) is seen within the
second. A token not found is never remembered: each guess is counted (cluster.api.throttling).
"""

from __future__ import annotations

import json

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models.expressions import Col
from django.utils.translation import gettext_lazy as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token

from cluster.agents import REVOKED_CREDENTIAL, UNKNOWN_CREDENTIAL, credential_for
from cluster.api.memo import MISSING, Memo
from cluster.api.throttling import blocked_for, client_address, record_failure
from cluster.roles import remember_groups

_query: dict[str, tuple] = {}
TOKEN_MEMO_S = 1.0
_known = Memo(TOKEN_MEMO_S)  # token key -> its row, converted


def forget_tokens(**_) -> None:
    """Forget every remembered token (connected to the user, group membership and token signals)."""
    _known.clear()


def _statement():
    """(SQL, user field attnames, per-field converters), built once per database vendor."""
    cached = _query.get(connection.vendor)
    if cached is not None:
        return cached
    user_model = get_user_model()
    qn = connection.ops.quote_name
    fields = list(user_model._meta.concrete_fields)
    membership = user_model.groups.through._meta
    group = user_model.groups.field.related_model._meta
    agg = "json_agg" if connection.vendor == "postgresql" else "json_group_array"
    groups = (
        f"(SELECT {agg}(g.{qn('name')}) FROM {qn(group.db_table)} g "
        f"JOIN {qn(membership.db_table)} m ON m.{qn('group_id')} = g.{qn('id')} "
        f"WHERE m.{qn('user_id')} = u.{qn(user_model._meta.pk.column)})"
    )
    columns = ", ".join(f"u.{qn(f.column)}" for f in fields)
    token = Token._meta
    sql = (
        f"SELECT t.{qn('created')}, {groups}, {columns} FROM {qn(token.db_table)} t "
        f"JOIN {qn(user_model._meta.db_table)} u ON u.{qn(user_model._meta.pk.column)} = t.{qn('user_id')} "
        f"WHERE t.{qn('key')} = %s"
    )
    # the converters the ORM would apply to each column (SQLite returns datetimes as text)
    converters = []
    for f in [token.get_field("created"), *fields]:
        col = Col("x", f)
        converters.append((col, connection.ops.get_db_converters(col) + f.get_db_converters(connection)))
    cached = _query[connection.vendor] = (sql, [f.attname for f in fields], converters)
    return cached


def _convert(value, col, converters):
    for converter in converters:
        value = converter(value, col, connection)
    return value


def _guarded(request, check):
    """Run ``check`` unless the caller's address is locked out for failed credentials; count a
    failure (cluster.api.throttling)."""
    who = client_address(request)
    wait = blocked_for("token", who)
    if wait:
        raise exceptions.Throttled(
            wait, detail=f"too many failed credentials from {who}; try again in {wait} s"
        )
    try:
        return check()
    except exceptions.AuthenticationFailed:
        record_failure("token", who)
        raise


class TokenAuthentication(authentication.TokenAuthentication):
    """``Authorization: Token <key>``, as DRF's, in one query that also reads the user's groups."""

    def authenticate(self, request):
        return _guarded(request, lambda: super(TokenAuthentication, self).authenticate(request))

    def authenticate_credentials(self, key):
        sql, attnames, converters = _statement()
        known = _known.get(key)
        if known is not MISSING:
            created, groups, values = known
        else:
            with connection.cursor() as cursor:
                cursor.execute(sql, [key])
                row = cursor.fetchone()
            if row is None:
                raise exceptions.AuthenticationFailed(_("Invalid token."))
            groups = row[1]
            if isinstance(groups, str):  # SQLite returns JSON as text
                groups = json.loads(groups)
            created, *values = [
                _convert(v, col, conv) for v, (col, conv) in zip([row[0], *row[2:]], converters, strict=True)
            ]
            _known.put(key, (created, groups, values))
        # a user of its own for each request (views may set attributes on it)
        user = get_user_model().from_db(connection.alias, attnames, list(values))
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        remember_groups(user, (g for g in groups or () if g is not None))  # the role check reads them
        token = Token(key=key, user=user, created=created)
        token._state.adding, token._state.db = False, connection.alias
        return (user, token)


class NodePrincipal:
    """The caller behind a node credential: it has no role, so every endpoint that checks roles
    answers 403; the agent endpoints check for this principal and its node instead."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    is_anonymous = False
    pk = id = None

    def __init__(self, credential):
        self.credential = credential
        self.node = credential.node
        self.username = f"node:{credential.node.hostname}"
        self._myriad_groups: set[str] = set()

    def __str__(self) -> str:
        return self.username


class NodeCredentialAuthentication(authentication.BaseAuthentication):
    """``Authorization: Node <credential>``: a node's agent, bound to its node."""

    keyword = "Node"

    def authenticate(self, request):
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        return _guarded(request, lambda: self._credential(parts))

    def _credential(self, parts):
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Invalid node credential header: Node <credential>.")

        credential = credential_for(parts[1].decode(errors="replace"))
        if credential is None:
            raise exceptions.AuthenticationFailed(UNKNOWN_CREDENTIAL)
        if credential.revoked_at is not None:
            raise exceptions.AuthenticationFailed(REVOKED_CREDENTIAL)
        return (NodePrincipal(credential), credential)

    def authenticate_header(self, request) -> str:
        return self.keyword


class NodeCredentialScheme(OpenApiAuthenticationExtension):
    """How the API description names a node agent's credential."""

    target_class = NodeCredentialAuthentication
    name = "nodeCredential"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "A node agent's credential: `Node <credential>`",
        }
