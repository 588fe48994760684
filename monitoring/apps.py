from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"

    def ready(self) -> None:
        # inside ready: the receivers import models and tasks, which need the app registry
        from cluster.signals import nodes_changed
        from monitoring import receivers, signals
        from scheduling.cycle import cycle_ran
        from scheduling.launch import job_launched
        from scheduling.signals import congestion_asked, partitions_asked

        nodes_changed.connect(receivers.clear_faults_of_returned_nodes, dispatch_uid="monitoring.node-return")
        job_launched.connect(receivers.measure_recovery, dispatch_uid="monitoring.measure-recovery")
        cycle_ran.connect(receivers.record_cycle, dispatch_uid="monitoring.cycle-metrics")
        congestion_asked.connect(receivers.congested_pods_now, dispatch_uid="monitoring.congested-pods")
        partitions_asked.connect(receivers.partitioned_datacenters, dispatch_uid="monitoring.partitions")
        signals.fault_recorded.connect(receivers.queue_fault, dispatch_uid="monitoring.queue-fault")
        signals.simulation_parts_wanted.connect(
            receivers.queue_simulation_parts, dispatch_uid="monitoring.queue-simulation-parts"
        )
