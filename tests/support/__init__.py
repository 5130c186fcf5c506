"""Harness code the tests share: servers, clients, ports, model writers, the oracle (see tests/README.md)."""
