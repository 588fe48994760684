from django.apps import AppConfig


class ClusterConfig(AppConfig):
    name = "cluster"
    verbose_name = "Cluster inventory"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import m2m_changed, post_delete, post_save
        from rest_framework.authtoken.models import Token, TokenProxy

        from cluster.api.authentication import forget_tokens

        user = get_user_model()
        # a token remembered by this web process is forgotten when its user, roles or tokens change
        for name, signal in (("save", post_save), ("delete", post_delete)):
            for model in (user, Token, TokenProxy):  # the admin's token pages use the proxy
                uid = f"forget-tokens-{name}-{model.__name__}"
                signal.connect(forget_tokens, sender=model, dispatch_uid=uid)
        m2m_changed.connect(forget_tokens, sender=user.groups.through, dispatch_uid="forget-tokens-groups")
