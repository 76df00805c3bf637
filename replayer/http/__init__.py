"""The wire: sans-I/O SSE and chunk decoding, the HTTP/1.1 connection and its pool, the client that
measures each exchange, the launcher process that writes requests at their due time. A request's
failure is a value in its result, never an exception.

The names below are this stage's facade (imported on first use); the modules are its own.
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.http.chunks import StreamAccumulator
    from replayer.http.client import Client
    from replayer.http.connection import Connection
    from replayer.http.launcher import launcher_ready, start_launcher
    from replayer.http.pool import Pool
    from replayer.http.sse import SSEDecoder

__all__ = ["Client", "Pool", "Connection", "start_launcher", "launcher_ready", "SSEDecoder", "StreamAccumulator"]
__getattr__ = facade(
    __name__,
    {
        "Client": ".client",
        "Pool": ".pool",
        "Connection": ".connection",
        "start_launcher": ".launcher",
        "launcher_ready": ".launcher",
        "SSEDecoder": ".sse",
        "StreamAccumulator": ".chunks",
    },
)
