"""--tls-cert / --tls-key serve both front-ends over TLS."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import granian  # noqa: F401  (in the test extra: missing, it is an error, not a skip)
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.clients import grpc_server_for
from tests.support.process import ServerProcess


@pytest.fixture
def cert(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key, crt = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return crt, key


@pytest.mark.parametrize("http_server", ["builtin", "hypercorn", "granian"])
def test_tls_on_both_front_ends(
    launch: Callable[..., ServerProcess], cert: tuple[Path, Path], http_server: str, tmp_path: Path
) -> None:
    crt, key = cert
    srv = launch(
        None, "--tls-cert", str(crt), "--tls-key", str(key), "--http-server", http_server,
        "--grpc-server", grpc_server_for(http_server), tls=True,
    )  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(crt))
    with urllib.request.urlopen(f"https://localhost:{srv.http_port}/v2/health/ready", context=ctx, timeout=5) as r:
        assert r.status == 200
    client = grpcclient.InferenceServerClient(f"localhost:{srv.grpc_port}", ssl=True, root_certificates=str(crt))
    assert client.is_server_live()
    assert client.is_model_ready("accumulator")
    # tritonclient over HTTPS, as docs/security.md shows it
    https = httpclient.InferenceServerClient(f"localhost:{srv.http_port}", ssl=True, ssl_options={"ca_certs": str(crt)})
    try:
        assert https.is_server_live() and https.is_model_ready("accumulator")
    finally:
        https.close()
