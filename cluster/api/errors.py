"""API errors: database and domain refusals become clear 4xx answers, never a 500."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.db.models import ProtectedError
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from engine.states import InvalidTransition


def exception_handler(exc, context):
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {"detail": f"request body larger than {limit:,} bytes"},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, TooManyFieldsSent):
        return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return Response(detail, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, InvalidTransition):
        return Response({"state": [str(exc)]}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, IntegrityError):
        # a row this request relied on changed under it (a concurrent delete of what it points
        # at, found at the commit): the transaction rolled back, so nothing was written
        return Response(
            {
                "detail": "a row this request depends on was changed by another request while it ran; "
                "nothing was written, try again"
            },
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, ProtectedError):
        names = ", ".join(sorted({str(o) for o in list(exc.protected_objects)[:5]}))
        return Response({"detail": f"still in use by {names}"}, status=status.HTTP_409_CONFLICT)
    return drf_exception_handler(exc, context)
