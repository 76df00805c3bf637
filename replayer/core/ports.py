"""Port numbers given as settings: 0 to 65535 (0 = a free port, where a server listens), any other
refused with the value named. A port past 65535 is not refused by the socket call: it is taken
modulo 65536, and a server would listen on another port than the one asked for, silently."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

__all__ = ["MAX_PORT", "port_number", "url_port_problem"]

#: the largest TCP port
MAX_PORT = 65535


def port_number(text: str) -> int:
    """The ``type`` of a port flag (``--port``, ``--admin-port``): ``text`` as a port, or
    ``argparse.ArgumentTypeError`` (argparse prints it after the flag's name and exits 2)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to {MAX_PORT})") from None
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"a port is 0 to {MAX_PORT} (0 = a free port), got {port}")
    return port


def url_port_problem(url: str) -> str | None:
    """Why ``url``'s port is not one (past 65535, not a number), or None (no port, or a good one)."""
    try:
        port = urlsplit(url).port  # (ValueError past 65535 or not a number)
    except ValueError:
        port = -1
    return f"{url}: its port must be a number from 1 to {MAX_PORT}" if port == -1 else None
