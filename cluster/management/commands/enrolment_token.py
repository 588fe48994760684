from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from cluster.agents import DEFAULT_TOKEN_TTL_S, EnrolmentError, create_enrolment_token
from cluster.models import Node


class Command(BaseCommand):
    help = (
        "Make a one-time enrolment token for a node's agent and print it (the database keeps only its "
        "digest). With --node the token enrols that node; without, the node named by the agent's hostname."
    )

    def add_arguments(self, parser):
        parser.add_argument("--node", help="hostname of the node it enrols (default: the agent's hostname)")
        parser.add_argument("--ttl", type=int, default=DEFAULT_TOKEN_TTL_S, help="seconds until it expires")
        parser.add_argument("--actor", default="manage.py", help="who made it, for the audit record")

    def handle(self, *args, node: str | None, ttl: int, actor: str, **options):
        target = None
        if node:
            target = Node.objects.filter(hostname=node).first()
            if target is None:
                raise CommandError(f"--node: no node {node!r} in the inventory")
        try:
            token, secret = create_enrolment_token(actor=actor, node=target, ttl_s=ttl)
        except EnrolmentError as exc:
            raise CommandError(f"--ttl: {exc.message}") from exc
        self.stdout.write(f"enrolment_token={secret}")
        who = target or "the node named by the agent's hostname"
        self.stdout.write(f"one use, for {who}, until {token.expires_at:%Y-%m-%d %H:%M} UTC")
