"""The TLS and restricted-API flags of both front-ends (docs/security.md)."""

from __future__ import annotations

import argparse

from seqserve.api import security


def add_tls_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--tls-cert", help="PEM certificate for both front-ends")
    s.add_argument("--tls-key", help="PEM private key for both front-ends")
    s.add_argument("--http-tls-cert", help="PEM certificate for HTTP (overrides --tls-cert)")
    s.add_argument("--http-tls-key", help="PEM private key for HTTP (overrides --tls-key)")
    s.add_argument("--grpc-tls-cert", help="PEM certificate for gRPC (overrides --tls-cert)")
    s.add_argument("--grpc-tls-key", help="PEM private key for gRPC (overrides --tls-key)")
    s.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="mutual TLS on both front-ends: clients must present a certificate signed by a CA of this PEM "
        "bundle (needs --tls-cert/--tls-key or the front-end's own)",
    )
    s.add_argument("--http-tls-client-ca", metavar="PEM", help="mutual TLS for HTTP (overrides --tls-client-ca)")
    s.add_argument("--grpc-tls-client-ca", metavar="PEM", help="mutual TLS for gRPC (overrides --tls-client-ca)")


def add_restriction_flags(s: argparse.ArgumentParser) -> None:
    groups = ", ".join(security.GROUPS)
    s.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help="as Triton's option: HTTP requests to these APIs must carry the header KEY with VALUE, or get "
        f"403. Repeat it for groups with other keys; an API may be in one group only. APIs: {groups}",
    )
    s.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="PROTOCOL[,PROTOCOL...]:KEY=VALUE",
        help="as Triton's option: gRPC calls to these protocols must carry the metadata "
        f"'{security.GRPC_HEADER_PREFIX}KEY' with VALUE, or get UNAVAILABLE. Repeatable, as "
        f"--http-restricted-api. Protocols: {groups}",
    )
