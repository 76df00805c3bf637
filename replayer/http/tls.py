"""TLS towards a target: the client ``SSLContext`` from the settings (``--ca-bundle``,
``--client-cert``/``--client-key``, ``--tls-server-name``, ``--insecure``), shared by the hot-path
client, the readiness check, the target-metrics scrape and ``replayer record --upstream``, and
the words for a TLS failure.

A TLS failure is named by its cause (unknown CA, name mismatch, expired, client certificate
required, handshake timeout) with the certificate the server showed (subject, issuer, names,
validity), never as a traceback: ``explain`` reads the cause from the ``ssl`` exception, and
``peer_certificate`` fetches the certificate once more without verifying it (a verification
failure carries no certificate), to name it.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any

#: OpenSSL's X509 verify codes, by the cause a user acts on
_UNKNOWN_CA = {2, 18, 19, 20, 21}  # issuer unknown, self-signed (leaf or in chain), no local issuer
_EXPIRED = {10, 12}  # certificate (or CRL) has expired
_NOT_YET_VALID = {9, 11}
_NAME_MISMATCH = {62, 64}  # host name / IP address mismatch


class TLSSettingsError(ValueError):
    """A TLS setting that cannot be used (a file missing or not PEM, a key that does not match)."""


@dataclass(frozen=True)
class TLSOptions:
    """How to speak TLS to a target: ``ca_bundle`` (PEM file of the CAs to trust instead of the
    system's), ``client_cert``/``client_key`` (PEM; mutual TLS; the key may be in the cert file),
    ``server_name`` (sent as SNI and checked against the certificate instead of the URL's host:
    a target given by IP address or through a tunnel), ``insecure`` (no verification at all)."""

    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    server_name: str | None = None
    insecure: bool = False

    def context(self) -> ssl.SSLContext:
        """A client context for these options (raises TLSSettingsError naming the file)."""
        try:
            ctx = ssl.create_default_context(cafile=self.ca_bundle)
        except (ssl.SSLError, OSError) as e:
            raise TLSSettingsError(
                f"--ca-bundle {self.ca_bundle}: not a readable PEM file of CA certificates ({e})"
            ) from None
        if self.client_cert:
            try:
                ctx.load_cert_chain(self.client_cert, self.client_key)
            except (ssl.SSLError, OSError) as e:
                raise TLSSettingsError(
                    f"--client-cert {self.client_cert}"
                    + (
                        f" --client-key {self.client_key}: cannot load the client certificate and key"
                        if self.client_key
                        else ": cannot load the client certificate and its key (without --client-key the key must "
                        "be in the same file: give the key's file with --client-key)"
                    )
                    + f" ({e})"
                ) from None
        elif self.client_key:
            raise TLSSettingsError("--client-key needs --client-cert (the certificate the key belongs to)")
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def request_kwargs(self, https: bool) -> dict[str, Any]:
        """aiohttp request keywords for a request to an ``https`` URL (``ssl``, ``server_hostname``);
        none for plain HTTP."""
        if not https:
            return {}
        kw: dict[str, Any] = {"ssl": self.context()}
        if self.server_name:
            kw["server_hostname"] = self.server_name
        return kw


def find_ssl_error(exc: BaseException | None) -> ssl.SSLError | None:
    """The ``ssl.SSLError`` in ``exc`` or what caused it (aiohttp wraps it), else None."""
    seen = 0
    while exc is not None and seen < 8:
        inner = getattr(exc, "certificate_error", None) or getattr(exc, "os_error", None)
        if isinstance(inner, ssl.SSLError):  # (aiohttp's errors derive from ssl's too: the inner one first)
            return inner
        if isinstance(exc, ssl.SSLError) and exc.__module__ == "ssl":
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def explain(e: ssl.SSLError) -> str:
    """The cause of a TLS failure in a user's words, with OpenSSL's own text."""
    if isinstance(e, ssl.SSLCertVerificationError):
        code, text = e.verify_code, e.verify_message or str(e)
        if code in _UNKNOWN_CA:
            cause = "unknown CA: the server's certificate is not signed by a CA this client trusts (--ca-bundle)"
        elif code in _EXPIRED:
            cause = "expired certificate"
        elif code in _NOT_YET_VALID:
            cause = "certificate not yet valid (check the clocks)"
        elif code in _NAME_MISMATCH:
            cause = (
                "name mismatch: the certificate is not for the name checked (the URL's host, or --tls-server-name: "
                "give it a name the certificate lists)"
            )
        else:
            cause = "certificate verification failed"
        return f"{cause} ({text})"
    reason = (getattr(e, "reason", None) or "").upper()
    if "CERTIFICATE_REQUIRED" in reason:
        return f"the server requires a client certificate (--client-cert, --client-key) ({e.reason})"
    if "ALERT_HANDSHAKE_FAILURE" in reason:
        return f"the server refused the handshake: a client certificate required (--client-cert)? ({e.reason})"
    if "BAD_CERTIFICATE" in reason or "UNKNOWN_CA" in reason or "CERTIFICATE_UNKNOWN" in reason:
        return f"the server rejected the client certificate ({e.reason})"
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER" in reason or "PACKET_LENGTH" in reason:
        return f"the server does not speak TLS on this port (an http:// target?) ({e.reason})"
    return f"TLS handshake failed ({e.reason or e})"


def describe_certificate(der: bytes) -> str:
    """One line naming a DER certificate: subject, issuer, names, validity."""
    from cryptography import x509

    cert = x509.load_der_x509_certificate(der)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
            str(v) for v in san.get_values_for_type(x509.IPAddress)
        ]
    except x509.ExtensionNotFound:
        names = []
    return (
        f"certificate subject {cert.subject.rfc4514_string() or '(empty)'}, issuer {cert.issuer.rfc4514_string()}"
        + (f", names {', '.join(names)}" if names else "")
        + f", valid {cert.not_valid_before_utc:%Y-%m-%d %H:%M} to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    )


def _unverified() -> ssl.SSLContext:
    """A client context that verifies nothing: to look at what a server shows, never to send."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def peer_certificate(host: str, port: int, server_name: str | None, timeout_s: float) -> str | None:
    """The certificate ``host:port`` shows (``describe_certificate``), read without verifying
    it; None when it cannot be had (the server is gone, no TLS there)."""
    ctx = _unverified()
    loop = asyncio.get_running_loop()
    transport: asyncio.Transport | None = None
    try:
        transport, _ = await asyncio.wait_for(
            loop.create_connection(asyncio.Protocol, host, port, ssl=ctx, server_hostname=server_name or host),
            timeout_s,
        )
        obj = transport.get_extra_info("ssl_object") if transport is not None else None
        der = obj.getpeercert(binary_form=True) if obj is not None else None
        return describe_certificate(der) if der else None
    except Exception:  # noqa: BLE001 - only a better message is lost
        return None
    finally:
        if transport is not None:
            transport.abort()


async def tls_answers(host: str, port: int, server_name: str | None, timeout_s: float) -> str:
    """What ``host:port`` does with a TLS handshake (not verified): ``"tls"`` (it completes),
    ``"silent"`` (the TCP connection opens, the handshake does not finish within ``timeout_s``),
    ``"no"`` (refused, closed, or not TLS)."""
    ctx = _unverified()
    loop = asyncio.get_running_loop()
    try:
        transport, _ = await asyncio.wait_for(loop.create_connection(asyncio.Protocol, host, port), timeout_s)
    except (OSError, asyncio.TimeoutError):
        return "no"
    try:
        tls = await asyncio.wait_for(
            loop.start_tls(transport, transport.get_protocol(), ctx, server_hostname=server_name or host), timeout_s
        )
        if tls is not None:
            tls.abort()
        return "tls"
    except asyncio.TimeoutError:
        return "silent"
    except (OSError, ssl.SSLError, ConnectionError):
        return "no"
    finally:
        transport.abort()


async def describe_failure(
    e: ssl.SSLError, host: str, port: int, server_name: str | None, timeout_s: float = 5.0, where: str | None = None
) -> str:
    """``explain(e)``, with the certificate the server shows when its verification failed;
    ``where``: the server as the user named it (default ``host:port``)."""
    text = f"TLS error with {where or f'{host}:{port}'}: {explain(e)}"
    if isinstance(e, ssl.SSLCertVerificationError):
        cert = await peer_certificate(host, port, server_name, timeout_s)
        if cert:
            text += f"; {cert}"
    return text


async def probe(
    host: str, port: int, ctx: ssl.SSLContext, server_name: str | None, timeout_s: float, has_client_cert: bool
) -> str | None:
    """Why requests to ``host:port`` over TLS fail, if TLS is why: a handshake and one small
    request's first response byte. TLS 1.3 checks the client's certificate after the handshake:
    a server that refuses it sends an alert (``explain`` names it) or, as some event loops do,
    just closes the connection, which this reads as "client certificate required or refused"
    (what else closes a fresh connection to a request without a byte of answer). None when the
    request was answered or failed otherwise."""
    writer: asyncio.StreamWriter | None = None
    try:
        reader, w = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx, server_hostname=server_name or host), timeout_s
        )
        writer = w
        w.write(f"GET /health HTTP/1.1\r\nHost: {server_name or host}\r\nConnection: close\r\n\r\n".encode())
        first = await asyncio.wait_for(reader.read(1), timeout_s)
    except ssl.SSLError as e:
        return explain(e)
    except (OSError, asyncio.TimeoutError):
        return None
    finally:
        if writer is not None:
            writer.transport.abort()
    if first:
        return None
    if has_client_cert:
        return "the server closed the connection after the TLS handshake without answering: it refused the client certificate (--client-cert)?"
    return (
        "the server closed the connection after the TLS handshake without answering: it requires a client "
        "certificate (--client-cert, --client-key)?"
    )
