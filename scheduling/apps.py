from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"

    def ready(self) -> None:
        # inside ready: the receivers import models and tasks, which need the app registry
        from cluster.signals import nodes_changed
        from scheduling import receivers, signals

        nodes_changed.connect(receivers.schedule_after_node_change, dispatch_uid="scheduling.node-change")
        signals.cycle_wanted.connect(receivers.queue_cycle, dispatch_uid="scheduling.queue-cycle")
        signals.services_changed.connect(receivers.queue_autoscale, dispatch_uid="scheduling.autoscale")
