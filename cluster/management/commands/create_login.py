from __future__ import annotations

import secrets

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandError
from rest_framework.authtoken.models import Token

from cluster.roles import OPERATOR, VIEWER


class Command(BaseCommand):
    help = (
        "Create or reset a login with a role (viewer, operator, admin) and print its password and API token."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", choices=[VIEWER, OPERATOR, "admin"], default=OPERATOR)
        parser.add_argument("--password", help="password to set (default: a new random one, printed)")

    def handle(self, *args, username: str, role: str, password: str | None, **options):
        if not username.strip():
            raise CommandError("username must not be empty")
        password = password or secrets.token_urlsafe(12)
        user, created = User.objects.get_or_create(username=username)
        user.set_password(password)
        user.is_staff = role in (OPERATOR, "admin")  # operators may use the admin for inventory
        user.is_superuser = role == "admin"
        user.save()
        user.groups.set([Group.objects.get_or_create(name=OPERATOR if role == "admin" else role)[0]])
        if role == OPERATOR:
            from django.contrib.auth.models import Permission

            user.user_permissions.set(Permission.objects.filter(content_type__app_label__in=["cluster"]))
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(
            f"{'Created' if created else 'Reset'} {role} login: username={username} password={password} "
            f"api_token={token.key}"
        )
