"""The load generator behind ``python -m bench``: transports, workloads, targets, reports."""
