"""Replicas behind HAProxy with a shared state store (``python -m bench.scaleout``), and its session load."""
