"""The login page, locked for a while after too many failed attempts from one address."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.http import HttpResponse

from cluster.api.throttling import blocked_for, clear_failures, client_address, record_failure


class LoginView(auth_views.LoginView):
    def post(self, request, *args, **kwargs):
        who = client_address(request)
        wait = blocked_for("login", who)
        if wait:
            return _locked(wait)
        response = super().post(request, *args, **kwargs)
        if request.user.is_authenticated:
            clear_failures("login", who)
            return response
        wait = record_failure("login", who)
        return _locked(wait) if wait else response


def _locked(wait: int) -> HttpResponse:
    response = HttpResponse(
        f"Too many failed logins from this address: try again in {wait} seconds.\n",
        status=429,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(wait)
    return response
