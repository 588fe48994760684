"""Roles: viewer (read), operator (read, write, actions), admin (Django staff).

Roles are Django groups so operators manage them in the admin like any other membership.
"""

from __future__ import annotations

VIEWER = "viewer"
OPERATOR = "operator"


def _groups(user) -> set[str]:
    cached = getattr(user, "_myriad_groups", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True))
        user._myriad_groups = cached
    return cached


def remember_groups(user, names) -> None:
    """Give the role checks a user's group names read elsewhere (API token authentication reads
    them with the token), so they need no query of their own."""
    user._myriad_groups = set(names)


def is_operator(user) -> bool:
    if not user or not user.is_authenticated or not user.is_active:
        return False
    return user.is_superuser or OPERATOR in _groups(user)


def is_viewer(user) -> bool:
    """True for anyone allowed to read: viewers, operators and staff."""
    if not user or not user.is_authenticated or not user.is_active:
        return False
    return user.is_staff or user.is_superuser or bool(_groups(user) & {VIEWER, OPERATOR})


def role_name(user) -> str:
    if is_operator(user):
        return "admin" if user.is_superuser else OPERATOR
    if is_viewer(user):
        return VIEWER
    return "none"
