"""HTTPS through the policed connections: the socket goes to the address the policy judged, and
the certificate is still verified against the host name (SNI), on a real TLS server on
127.0.0.1 with a certificate made for the test."""

from __future__ import annotations

import contextlib
import datetime
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ratejobs.execution import HttpRequest, send
from ratejobs.execution.connections import new_session
from tests.execution.test_outbound import answers
from tests.realhttp import LOOPBACK

NAME = "api.tls.test"  # never looked up: the tests' resolver answers 127.0.0.1 for it


@dataclass
class TlsServer:
    port: int
    ca_file: Path
    server_names: list[str | None]


class _Hello(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")


def _certificate(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / "cert.pem", tmp / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory) -> Iterator[TlsServer]:
    cert_file, key_file = _certificate(tmp_path_factory.mktemp("tls"))
    server_names: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    context.sni_callback = lambda sock, name, ctx: server_names.append(name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.handle_error = lambda request, address: None  # failed handshakes are the point
    thread = threading.Thread(target=server.serve_forever, name="test-tls", daemon=True)
    thread.start()
    yield TlsServer(server.server_address[1], cert_file, server_names)
    server.shutdown()
    server.server_close()


def test_https_connects_to_the_judged_address_and_verifies_the_host_name(tls_server):
    session = new_session(LOOPBACK, resolver=answers("127.0.0.1"))
    session.verify = str(tls_server.ca_file)
    result = send(session, HttpRequest("GET", f"https://{NAME}:{tls_server.port}/"))
    assert result.status_code == 200 and result.body == b"hello"
    assert tls_server.server_names[-1] == NAME  # SNI carried the name, not the address


def test_https_to_a_name_the_certificate_does_not_cover_fails_verification(tls_server):
    # given the same server reached by its address: the certificate names api.tls.test only
    session = new_session(LOOPBACK)
    session.verify = str(tls_server.ca_file)
    result = send(session, HttpRequest("GET", f"https://127.0.0.1:{tls_server.port}/"))
    assert result.error_kind == "connect" and result.status_code is None
    assert "certificate" in result.error.lower(), result.error


@pytest.fixture
def trickling_handshake() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that answers a TLS ClientHello one byte every 0.3 s, never
    finishing: each read of the handshake gets a byte long before any timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    stop = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            connection, _ = listener.accept()
            with connection:
                connection.recv(4096)  # the ClientHello
                hello = b"\x16\x03\x03\x40\x00" + b"\x02" * 0x4000  # a 16 KiB ServerHello
                for byte in hello:
                    if stop.wait(0.3):
                        return
                    connection.sendall(bytes([byte]))

    thread = threading.Thread(target=serve, name="test-tls-trickle", daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    listener.close()
    thread.join(5)


def test_a_trickling_tls_handshake_hits_the_total_timeout(trickling_handshake):
    session = new_session(LOOPBACK)
    started = time.monotonic()
    result = send(
        session,
        HttpRequest("GET", f"https://127.0.0.1:{trickling_handshake}/"),
        connect_timeout=30,
        read_timeout=30,
        total_timeout=1,
    )
    assert time.monotonic() - started < 1.5
    assert result.error_kind == "connect" and "within 1s in total" in result.error
