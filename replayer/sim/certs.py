"""Throw-away TLS material for the simulator, the tests and the docs' walkthrough
(``replayer tls-certs DIR``): a private CA and a server and a client certificate it signed, written
as PEM files (by ``trustme``, a well-kept library for exactly this), and the simulator's server
context (``replayer sim --tls-cert --tls-key [--tls-client-ca]``).

Never for production: the CA's key is written beside its certificate.
"""

from __future__ import annotations

import datetime as dt
import os
import ssl

#: the files ``write_certs`` writes, by role
FILES = {
    "ca": "ca.pem",
    "server_cert": "server.pem",
    "server_key": "server.key",
    "client_cert": "client.pem",
    "client_key": "client.key",
}


def write_certs(
    folder: str,
    names: list[str] | None = None,
    *,
    days: float = 30.0,
    expired: bool = False,
    client_name: str = "replayer-client",
) -> dict[str, str]:
    """Write a new CA (``ca.pem``), a server certificate for ``names`` (default: localhost,
    127.0.0.1, ::1) with its key (``server.pem``, ``server.key``) and a client certificate with
    its key (``client.pem``, ``client.key``) into ``folder`` (created); the certificates are valid
    for ``days`` from an hour ago, or ended an hour ago when ``expired`` (to see that error).
    Returns role -> path."""
    import trustme

    names = names or ["localhost", "127.0.0.1", "::1"]
    now = dt.datetime.now(dt.timezone.utc)
    start = now - dt.timedelta(days=days + 1) if expired else now - dt.timedelta(hours=1)
    end = now - dt.timedelta(hours=1) if expired else now + dt.timedelta(days=days)
    ca = trustme.CA(organization_name="replayer throw-away CA")
    server = ca.issue_cert(*names, common_name=names[0], not_before=start, not_after=end)
    client = ca.issue_cert(client_name, common_name=client_name, not_before=start, not_after=end)
    os.makedirs(folder, exist_ok=True)
    paths = {role: os.path.join(folder, name) for role, name in FILES.items()}
    ca.cert_pem.write_to_path(paths["ca"])
    server.cert_chain_pems[0].write_to_path(paths["server_cert"])
    server.private_key_pem.write_to_path(paths["server_key"])
    client.cert_chain_pems[0].write_to_path(paths["client_cert"])
    client.private_key_pem.write_to_path(paths["client_key"])
    for role in ("server_key", "client_key"):
        os.chmod(paths[role], 0o600)
    return paths


def server_context(cert: str, key: str | None, client_ca: str | None = None) -> ssl.SSLContext:
    """A server context serving ``cert``/``key`` (PEM); with ``client_ca``, every client must show
    a certificate that CA signed (mutual TLS). Raises ValueError naming the file."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as e:
        raise ValueError(f"--tls-cert {cert}{f' --tls-key {key}' if key else ''}: cannot load ({e})") from None
    if client_ca:
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except (ssl.SSLError, OSError) as e:
            raise ValueError(f"--tls-client-ca {client_ca}: cannot load ({e})") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
