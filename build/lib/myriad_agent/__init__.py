"""myriad-agent: the node agent of a Myriad GPU cluster.

It runs on each GPU node without Django: it enrols once with a one-time token, reports the node's
GPU readings (NVML) and XIDs (NVML's event set) every period, starts and supervises the job
processes the control plane assigns to the node, and keeps the work running through outages of
the control plane, buffering its reports. Its only dependency is nvidia-ml-py.
"""

__version__ = "0.1.0"
