"""TLS in front of a plain TCP server, for tests: a throwaway CA and a relaying proxy.

The local RabbitMQ listens on plain AMQP only, and tests must not reconfigure it;
:class:`TLSProxy` terminates TLS on a free loopback port and relays the bytes both
ways to it, so that a client speaking AMQP over TLS (py-amqp's ``SSLTransport``)
talks to the real broker. :func:`make_ca` and :meth:`CA.issue` write the
certificates it needs, made at fixture time (nothing committed, nothing fetched).

The proxy runs an asyncio loop in a thread of its own: asyncio's TLS drives
OpenSSL through memory buffers, so one connection's reads and writes never share
an ``SSLSocket`` across threads. Every socket has ``TCP_NODELAY`` (the client's
frames are relayed as they come, not held back by Nagle's algorithm).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Bytes read at once from either side.
READ_SIZE = 65536
#: what a relayed connection's socket may buffer unread (Linux doubles it)
RECEIVE_BUFFER_BYTES = 65536
START_TIMEOUT_S = 5.0
#: The names a server certificate is for by default.
LOOPBACK = ("127.0.0.1", "localhost")
#: What a CA's key may sign.
_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
    key_encipherment=False, data_encipherment=False, key_agreement=False,
    encipher_only=False, decipher_only=False,
)  # fmt: skip


@dataclass(frozen=True)
class CA:
    """A certificate authority made for one test: its certificate in ``ca_file``."""

    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate
    ca_file: Path

    def issue(
        self, directory: Path, name: str = "server", hosts: tuple[str, ...] = LOOPBACK
    ) -> tuple[Path, Path]:
        """A server certificate for ``hosts`` (IP addresses or DNS names), signed by
        this CA: (certificate file, key file), written in ``directory``."""
        key = ec.generate_private_key(ec.SECP256R1())
        names = [_subject_name(host) for host in hosts]
        builder = (
            _builder(name, self.certificate.subject, key)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        )
        cert_file, key_file = directory / f"{name}.pem", directory / f"{name}-key.pem"
        _write_certificate(builder.sign(self.key, hashes.SHA256()), cert_file)
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))  # fmt: skip
        return cert_file, key_file


def make_ca(directory: Path, name: str = "qsched-test-ca") -> CA:
    """A new self-signed CA, its certificate written to ``directory/<name>.pem``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    certificate = (
        _builder(name, subject, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    ca_file = directory / f"{name}.pem"
    _write_certificate(certificate, ca_file)
    return CA(key, certificate, ca_file)


def _builder(
    name: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    """A certificate for ``name``, valid from a little before now for a day."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _subject_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_certificate(certificate: x509.Certificate, path: Path) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


class TLSProxy:
    """Accepts TLS on ``127.0.0.1:<port>`` and relays each connection's bytes both ways
    to ``upstream`` over plain TCP. A context manager: stopped (its connections
    closed, its thread joined) on exit.

    ``connections``: how many TLS handshakes succeeded (relayed connections), so far.
    """

    def __init__(self, cert_file: Path, key_file: Path,
                 upstream: tuple[str, int] = ("127.0.0.1", 5672)) -> None:  # fmt: skip
        self.upstream = upstream
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert_file, key_file)
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-proxy",
                                        daemon=True)  # fmt: skip
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def __enter__(self) -> TLSProxy:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.stop()

    def start(self) -> None:
        """Listen on a free loopback port (``port``)."""
        self._thread.start()
        self._server = self._call(self._listen())
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stop listening, close every connection, and end the proxy's thread."""
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    @property
    def running(self) -> bool:
        """Whether the proxy's thread still runs."""
        return self._thread.is_alive()

    def freeze(self) -> None:
        """Make the peer of every open connection go silent, as a broker whose host
        died or that stopped reading: nothing more is read, relayed or answered (a TLS
        close included), and nothing is closed. New connections are relayed as before."""
        self._call(self._freeze(True))

    def thaw(self) -> None:
        """Relay the open connections again, from where :meth:`freeze` stopped them."""
        self._call(self._freeze(False))

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(START_TIMEOUT_S)

    async def _listen(self) -> asyncio.Server:
        # A small receive buffer, set before listen() so that every accepted socket has
        # it from its handshake on: a frozen connection then takes in at most that much.
        # Left to Linux's autotuning, it grew to megabytes on a loaded machine and
        # swallowed a whole batch meant to stall its sender (the proxy saw one
        # connection where the test waited for two).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
        sock.bind(("127.0.0.1", 0))
        return await asyncio.start_server(self._relay, sock=sock, ssl=self.context,
                                          ssl_handshake_timeout=START_TIMEOUT_S)  # fmt: skip

    async def _relay(self, client_reader: asyncio.StreamReader,
                     client_writer: asyncio.StreamWriter) -> None:  # fmt: skip
        self.connections += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.transport.abort()
            return
        pair = {client_writer, upstream_writer}
        for writer in pair:
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._writers |= pair
        try:
            await asyncio.gather(_pump(client_reader, upstream_writer),
                                 _pump(upstream_reader, client_writer))  # fmt: skip
        finally:
            self._writers -= pair

    async def _freeze(self, frozen: bool) -> None:
        for writer in self._writers:
            transport = cast(asyncio.Transport, writer.transport)
            if frozen:
                transport.pause_reading()
            else:
                transport.resume_reading()

    async def _shutdown(self) -> None:
        """Close at once (no TLS close), and let the relays end."""
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        relays = asyncio.all_tasks() - {asyncio.current_task()}
        if relays:
            await asyncio.wait(relays, timeout=START_TIMEOUT_S)
        await self._server.wait_closed()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Relay ``reader`` to ``writer`` until either side closes; then close ``writer``."""
    try:
        while data := await reader.read(READ_SIZE):
            writer.write(data)
            await writer.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        writer.close()
