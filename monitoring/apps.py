from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"

    def ready(self) -> None:
        from cluster.signals import nodes_changed
        from monitoring.receivers import clear_faults_of_returned_nodes, measure_recovery, record_cycle
        from scheduling.cycle import cycle_ran
        from scheduling.launch import job_launched

        nodes_changed.connect(clear_faults_of_returned_nodes, dispatch_uid="monitoring.node-return")
        job_launched.connect(measure_recovery, dispatch_uid="monitoring.measure-recovery")
        cycle_ran.connect(record_cycle, dispatch_uid="monitoring.cycle-metrics")
