"""The "limits" flags: bounded input for both front-ends (docs/security.md, 'Bounded input')."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from seqserve.api import limits as lim
from seqserve.api.cli.values import int32_size, non_negative_int, seconds, timer_seconds

#: ``add_argument`` of the argument group the flags go to
AddFlag = Callable[..., argparse.Action]


def add_limit_flags(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("limits", "bounded input (docs/security.md, 'Bounded input')")
    _add_http_limits(g.add_argument)
    _add_grpc_message_limits(g.add_argument)
    _add_grpc_connection_limits(g.add_argument)


def _add_http_limits(add: AddFlag) -> None:
    add(
        "--http-max-body-bytes",
        type=int32_size,
        default=lim.DEFAULT_MAX_BODY_BYTES,
        metavar="BYTES",
        help="largest accepted HTTP request body, checked before and after decompression: larger gets 413 "
        f"(default: {lim.DEFAULT_MAX_BODY_BYTES}, 64 MiB, Triton's --http-max-input-size default)",
    )
    add(
        "--http-header-timeout-secs",
        type=timer_seconds,
        default=lim.DEFAULT_HEADER_TIMEOUT_S,
        metavar="SECONDS",
        help="a connection that has not sent a complete request head this long after it opened or after its "
        f"last response is closed (default: {lim.DEFAULT_HEADER_TIMEOUT_S:g})",
    )
    add(
        "--http-body-timeout-secs",
        type=timer_seconds,
        default=lim.DEFAULT_BODY_TIMEOUT_S,
        metavar="SECONDS",
        help="a request body from which no data arrives for this long gets 408 and its connection is closed "
        f"(default: {lim.DEFAULT_BODY_TIMEOUT_S:g})",
    )
    add(
        "--http-keepalive-secs",
        type=seconds,
        default=lim.DEFAULT_KEEPALIVE_S,
        metavar="SECONDS",
        help="how long an idle kept-alive connection waits for its next request, at most the header timeout; "
        f"0: one request per connection (default: {lim.DEFAULT_KEEPALIVE_S:g})",
    )
    add(
        "--http-max-connections",
        type=int32_size,
        default=lim.DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="most HTTP connections served at once (granian: more wait to be accepted; hypercorn: more get "
        f"503) (default: {lim.DEFAULT_MAX_CONNECTIONS})",
    )
    add(
        "--http-max-connections-per-peer",
        type=non_negative_int,
        default=lim.DEFAULT_MAX_CONNECTIONS_PER_PEER,
        metavar="N",
        help="most HTTP connections served at once from one client address, so that one client cannot take "
        "them all; more get 503 (builtin and hypercorn; granian: not limited). Behind a proxy every client "
        "shares its address: raise it, or 0 for no per-address limit "
        f"(default: {lim.DEFAULT_MAX_CONNECTIONS_PER_PEER})",
    )


def _add_grpc_message_limits(add: AddFlag) -> None:
    add(
        "--grpc-max-receive-message-bytes",
        type=int32_size,
        default=None,
        metavar="BYTES",
        help="largest gRPC request message: larger fails with RESOURCE_EXHAUSTED before it is read "
        "(default: --http-max-body-bytes)",
    )
    add(
        "--grpc-max-send-message-bytes",
        type=int32_size,
        default=None,
        metavar="BYTES",
        help="largest gRPC response message (default: --http-max-body-bytes)",
    )
    add(
        "--grpc-max-concurrent-streams",
        type=int32_size,
        default=lim.DEFAULT_GRPC_MAX_CONCURRENT_STREAMS,
        metavar="N",
        help="concurrent calls per gRPC connection; a client queues the calls beyond "
        f"(default: {lim.DEFAULT_GRPC_MAX_CONCURRENT_STREAMS})",
    )


def _add_grpc_connection_limits(add: AddFlag) -> None:
    add(
        "--grpc-max-connections",
        type=int32_size,
        default=lim.DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="most gRPC connections served at once by the builtin gRPC server; one beyond gets a GOAWAY and "
        f"is closed (grpcio: not limited) (default: {lim.DEFAULT_MAX_CONNECTIONS})",
    )
    add(
        "--grpc-max-connections-per-peer",
        type=non_negative_int,
        default=lim.DEFAULT_MAX_CONNECTIONS_PER_PEER,
        metavar="N",
        help="most gRPC connections served at once from one client address by the builtin gRPC server; one "
        "beyond gets a GOAWAY and is closed (grpcio: not limited); 0: no per-address limit "
        f"(default: {lim.DEFAULT_MAX_CONNECTIONS_PER_PEER})",
    )
    add(
        "--grpc-max-stream-backlog",
        type=int32_size,
        default=lim.DEFAULT_GRPC_STREAM_BACKLOG,
        metavar="N",
        help="requests one ModelStreamInfer stream may have read and not yet answered; beyond, the stream stops "
        "reading until its replies are written (the client waits on flow control) "
        f"(default: {lim.DEFAULT_GRPC_STREAM_BACKLOG})",
    )
    add(
        "--grpc-max-connection-idle-secs",
        type=seconds,
        default=lim.DEFAULT_GRPC_MAX_CONNECTION_IDLE_S,
        metavar="SECONDS",
        help="a gRPC connection with no call for this long is closed with a GOAWAY (clients reconnect on their "
        f"next call); 0: never (default: {lim.DEFAULT_GRPC_MAX_CONNECTION_IDLE_S:g})",
    )
    add(
        "--grpc-keepalive-secs",
        type=timer_seconds,
        default=lim.DEFAULT_GRPC_KEEPALIVE_S,
        metavar="SECONDS",
        help="interval of the server's keepalive pings on a gRPC connection, which find dead peers "
        f"(default: {lim.DEFAULT_GRPC_KEEPALIVE_S:g}, gRPC's and Triton's)",
    )
    add(
        "--grpc-keepalive-timeout-secs",
        type=timer_seconds,
        default=lim.DEFAULT_GRPC_KEEPALIVE_TIMEOUT_S,
        metavar="SECONDS",
        help="a connection whose peer does not answer a keepalive ping within this is closed "
        f"(default: {lim.DEFAULT_GRPC_KEEPALIVE_TIMEOUT_S:g})",
    )
