"""Shared pieces of the server-rendered pages: role checks, the page size and the form-error helper."""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied

from cluster.roles import is_operator, is_viewer

PAGE_SIZE = 50  # rows of a server-rendered list page
NO_ROLE = "Your account has no role; ask an administrator for viewer or operator."
NOT_OPERATOR = "Only operators may change this; your role is viewer."


def _role_page(view, *, operators_only: bool):
    @login_required
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not is_viewer(request.user):
            raise PermissionDenied(NO_ROLE)
        if (operators_only or request.method == "POST") and not is_operator(request.user):
            raise PermissionDenied(NOT_OPERATOR)
        return view(request, *args, **kwargs)

    return wrapped


def viewer_page(view):
    """Login required, and a role that may read; POSTs also need the operator role."""
    return _role_page(view, operators_only=False)


def operator_page(view):
    """Pages that only operators open at all (edit forms)."""
    return _role_page(view, operators_only=True)


def flat_errors(errors) -> list[str]:
    """DRF validation errors as 'field: message' lines for a form."""
    out = []

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if isinstance(v, dict | list):
                    walk(f"{prefix}[{i}]" if prefix else str(i), v)
                else:
                    out.append(f"{prefix}: {v}" if prefix and prefix != "non_field_errors" else str(v))
        else:
            out.append(f"{prefix}: {value}" if prefix else str(value))

    walk("", errors)
    return out
