"""The pure core every stage shares: the one clock, hashing, error and outcome kinds, the table of
endpoint kinds, the request and result records, the request event stream's protocol, timestamps
and ``derive()``, the SLO rule, the usage rule and the statistics sketches. No I/O.

The names below are this stage's facade (imported on first use); the modules are its own.
"""

from .facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.core.clock import Anchor, now_ns
    from replayer.core.endpoints import Endpoint, endpoint_kind
    from replayer.core.errors import ErrorKind, Outcome
    from replayer.core.events import QUIET, Quiet, RequestEvents
    from replayer.core.ports import port_number, url_port_problem
    from replayer.core.request import PreparedRequest
    from replayer.core.result import RequestResult
    from replayer.core.slo import judge_result, parse_goodput
    from replayer.core.stats import Stat
    from replayer.core.timestamps import Latencies, Timestamps, derive

__all__ = [
    "Anchor",
    "QUIET",
    "Quiet",
    "RequestEvents",
    "now_ns",
    "ErrorKind",
    "Outcome",
    "Endpoint",
    "endpoint_kind",
    "PreparedRequest",
    "RequestResult",
    "Timestamps",
    "Latencies",
    "derive",
    "Stat",
    "parse_goodput",
    "judge_result",
    "port_number",
    "url_port_problem",
]
__getattr__ = facade(
    __name__,
    {
        "Anchor": ".clock",
        "QUIET": ".events",
        "Quiet": ".events",
        "RequestEvents": ".events",
        "now_ns": ".clock",
        "ErrorKind": ".errors",
        "Outcome": ".errors",
        "Endpoint": ".endpoints",
        "endpoint_kind": ".endpoints",
        "PreparedRequest": ".request",
        "RequestResult": ".result",
        "Timestamps": ".timestamps",
        "Latencies": ".timestamps",
        "derive": ".timestamps",
        "Stat": ".stats",
        "parse_goodput": ".slo",
        "judge_result": ".slo",
        "port_number": ".ports",
        "url_port_problem": ".ports",
    },
)
