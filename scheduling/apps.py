from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"

    def ready(self) -> None:
        from cluster.signals import nodes_changed
        from scheduling.receivers import schedule_after_node_change

        nodes_changed.connect(schedule_after_node_change, dispatch_uid="scheduling.node-change")
