"""--tls-client-ca (mutual TLS) on both front-ends and both HTTP servers: a client without a
certificate, or with one another CA signed, is refused; one with a certificate the CA signed
works, tritonclient included."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from geventhttpclient.response import HTTPConnectionClosed
from tritonclient.utils import InferenceServerException

from tests.support.clients import grpc_server_for
from tests.support.process import ServerProcess, run_serve


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    key, crt = d / f"{name}.key", d / f"{name}.pem"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "1",
        "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return crt, key


def _leaf(d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    key, csr, crt, extfile = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.pem", d / f"{name}.ext"
    extfile.write_text(ext)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
        "-out", str(crt), "-days", "1", "-extfile", str(extfile),
    )  # fmt: skip
    return crt, key


class Pki:
    def __init__(self, d: Path) -> None:
        self.ca = _ca(d, "ca")
        self.server = _leaf(
            d, "server", self.ca, "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
        )
        self.client = _leaf(d, "client", self.ca, "extendedKeyUsage=clientAuth\n")
        self.rogue = _leaf(d, "rogue", _ca(d, "rogue-ca"), "extendedKeyUsage=clientAuth\n")

    def context(self, client: tuple[Path, Path] | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca[0]))
        if client is not None:
            ctx.load_cert_chain(str(client[0]), str(client[1]))
        return ctx


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    return Pki(tmp_path_factory.mktemp("pki"))


def _get(url: str, ctx: ssl.SSLContext) -> int:
    with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
        return int(r.status)


@pytest.mark.parametrize("http_server", ["builtin", "hypercorn", "granian"])
def test_mutual_tls_on_both_front_ends(launch: Callable[..., ServerProcess], pki: Pki, http_server: str) -> None:
    if http_server == "granian":
        pytest.importorskip("granian")
    ready = "/v2/health/ready"

    def probe(srv: ServerProcess) -> bool:
        try:
            return _get(f"https://localhost:{srv.http_port}{ready}", pki.context(pki.client)) == 200
        except OSError:
            return False

    (crt, key), ca = pki.server, pki.ca[0]
    srv = launch(
        None, "--tls-cert", str(crt), "--tls-key", str(key), "--tls-client-ca", str(ca), "--http-server", http_server,
        "--grpc-server", grpc_server_for(http_server), probe=probe,
    )  # fmt: skip
    assert f"gRPC ({grpc_server_for(http_server)}) listening" in srv.log()
    assert f"HTTP ({http_server}) listening on https://" in srv.log()
    assert "mutual TLS: client certificates from" in srv.log()
    url = f"https://localhost:{srv.http_port}{ready}"

    # HTTP: refused without a certificate, or with one another CA signed (the handshake fails,
    # or with TLS 1.3 the server's alert ends the connection at the first read)
    for client in (None, pki.rogue):
        with pytest.raises(OSError):  # ssl.SSLError, ConnectionResetError, URLError
            _get(url, pki.context(client))
    assert _get(url, pki.context(pki.client)) == 200

    # tritonclient over HTTPS with its ssl_options
    options = {"ca_certs": str(ca), "certfile": str(pki.client[0]), "keyfile": str(pki.client[1])}
    h = httpclient.InferenceServerClient(f"localhost:{srv.http_port}", ssl=True, ssl_options=options)
    assert h.is_server_live()
    x = np.ones((1, 4), dtype=np.float32)
    inputs = [httpclient.InferInput(n, [1, 4], "FP32") for n in ("INPUT0", "INPUT1")]
    for inp in inputs:
        inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(h.infer("add_sub", inputs).as_numpy("OUTPUT0"), 2 * x)
    h.close()
    bare = httpclient.InferenceServerClient(
        f"localhost:{srv.http_port}", ssl=True, ssl_options={"ca_certs": str(ca)}, network_timeout=10
    )
    # ssl.SSLError, or the connection reset or closed after the server's alert
    with pytest.raises((OSError, HTTPConnectionClosed)):
        bare.get_server_metadata()
    bare.close()

    # gRPC: the same
    for client_pair in (None, pki.rogue):
        g = grpcclient.InferenceServerClient(
            f"localhost:{srv.grpc_port}",
            ssl=True,
            root_certificates=str(ca),
            private_key=str(client_pair[1]) if client_pair else None,
            certificate_chain=str(client_pair[0]) if client_pair else None,
        )
        with pytest.raises(InferenceServerException) as gi:
            g.is_server_live(client_timeout=10)
        assert gi.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED"), gi.value
        g.close()
    g = grpcclient.InferenceServerClient(
        f"localhost:{srv.grpc_port}",
        ssl=True,
        root_certificates=str(ca),
        private_key=str(pki.client[1]),
        certificate_chain=str(pki.client[0]),
    )
    assert g.is_server_live()
    assert g.is_model_ready("accumulator")
    g.close()


def test_mutual_tls_on_one_front_end(launch: Callable[..., ServerProcess], pki: Pki) -> None:
    """--grpc-tls-client-ca: mutual TLS on gRPC only; HTTPS takes any client."""
    (crt, key), ca = pki.server, pki.ca[0]
    srv = launch(
        None, "--tls-cert", str(crt), "--tls-key", str(key), "--grpc-tls-client-ca", str(ca), tls=True
    )  # fmt: skip
    assert _get(f"https://localhost:{srv.http_port}/v2/health/ready", pki.context(None)) == 200
    g = grpcclient.InferenceServerClient(f"localhost:{srv.grpc_port}", ssl=True, root_certificates=str(ca))
    with pytest.raises(InferenceServerException):
        g.is_server_live(client_timeout=10)
    g.close()
    g = grpcclient.InferenceServerClient(
        f"localhost:{srv.grpc_port}",
        ssl=True,
        root_certificates=str(ca),
        private_key=str(pki.client[1]),
        certificate_chain=str(pki.client[0]),
    )
    assert g.is_server_live()
    g.close()


def test_tls_files_are_checked_before_the_server_starts(pki: Pki, tmp_path: Path) -> None:
    from seqserve.api import security

    (crt, key), ca = pki.server, pki.ca[0]
    security.check_tls("HTTP", security.TlsFiles(str(crt), str(key), str(ca)))
    cases = [
        (security.TlsFiles(str(crt), str(key), str(tmp_path / "none.pem")), "HTTP TLS: cannot read the client CA"),
        (security.TlsFiles(str(crt), str(key), str(key)), "HTTP TLS: the client CA '"),
        (security.TlsFiles(str(crt), str(pki.client[1]), None), "are not a PEM certificate and its key"),
        (security.TlsFiles(str(tmp_path / "none.pem"), str(key), None), "HTTP TLS: cannot read the certificate"),
    ]
    for tls, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            security.check_tls("HTTP", tls)
    proc = run_serve("--tls-cert", str(crt), "--tls-key", str(key), "--grpc-tls-client-ca", str(tmp_path / "none.pem"))
    assert proc.returncode == 2
    missing = tmp_path / "none.pem"
    assert proc.stderr == f"seqserve: gRPC TLS: cannot read the client CA '{missing}': No such file or directory\n"
