"""The regression gate's guards against what slows a whole run on the load generator's side (a
shared host's other work stalling the replayer), which the block bootstrap cannot see: its
resamples are drawn within the two runs, so a stall that hit one run is, to it, a change.

Two rules, both pure:

- **Persistence** (``transient``, over ``gate.half_changes``): a slower server is slower all run long, so a tail (``stall_prone``) regresses
  only when the change is past its minimum effect in *both* halves of the paired requests (trace
  order is time order), not just over the whole run. A stall of the host is a transient: it hits
  the requests in flight in a second or two of one run, and a tail (a p99, most of all the token
  gaps') moves in that half only. Such a change is held as a possible transient, and the reason
  says both halves' changes (what was seen, not its cause, which the gate cannot know).
- **A run the client slowed** (``client_late``): a run whose only fault is that the replayer sent
  late (its dispatch lag p99 over ``max_dispatch_lag_ms``, every other fidelity check passed) was
  slowed by its own host, and the same stalls that delayed its sends delayed its reads: its tails
  (percentiles above the median) and the metrics measured from the due time (which include the
  lateness) measure the client there, not the server. Rather than refuse the pair (exit 2), the
  gate judges it with those metrics ``not judged`` when they would regress (``guard``), and says
  why; the medians, the error rate and goodput are judged as usual. Its fidelity verdict's other
  checks passed, the inter-arrival test among them, so the server saw the trace's load: a single
  stall of a few hundred ms makes the 2 % of requests due in it late, not the load another one.
  A run later than ``max_client_lag_ms`` (p99, 1 s by default), or unfaithful for another reason
  (held back by a concurrency cap, another arrival pattern), is still refused.
"""

from __future__ import annotations

import math

#: metrics measured from the due time: they include the replayer's own lateness
FROM_DUE = ("ttft_from_due_ms", "e2el_from_due_ms")


def client_late(name: str, s: dict, max_lag_ms: float, max_client_lag_ms: float) -> str | None:
    """Why run ``name`` (its summary) was slowed by its own client, or None: its dispatch lag p99
    is over ``max_lag_ms`` but at most ``max_client_lag_ms``, and (where it has a ``fidelity``
    verdict) that lag is the verdict's only reason."""
    fid = s.get("fidelity")
    lag = s.get("dispatch_lag_p99_ms")
    if isinstance(fid, dict):
        reasons = [str(r) for r in fid.get("reasons") or []]
        if (
            fid.get("verdict") != "not_faithful"
            or not reasons
            or not all(r.startswith("dispatch lag") for r in reasons)
        ):
            return None
        lag = (fid.get("dispatch_lag_ms") or {}).get("p99", lag)
    if not isinstance(lag, (int, float)) or not max_lag_ms < lag <= max_client_lag_ms:
        return None
    return f"the {name} fell behind its trace, dispatch lag p99 {lag:.1f} ms: its own host slowed it"


def stall_prone(quantile: float | None, column: str | None) -> bool:
    """Whether a metric measures the client's stalls as much as the server: a percentile above
    the median (a stall is a tail), or a latency measured from the due time."""
    return column in FROM_DUE or (quantile is not None and quantile > 50)


def transient(halves: tuple[float | None, float | None], min_effect: float, direction: str) -> str | None:
    """Why a change past its minimum effect over the whole run is held, or None: a half of the
    run where it is not past the minimum effect (in ``direction``'s bad way). The reason says
    what was observed, not a cause: a host's stall and a server slower only part of the time
    look alike here."""
    sign = 1.0 if direction == "lower" else -1.0
    if any(h is None or math.isnan(h) for h in halves):
        return None
    first, second = halves
    assert first is not None and second is not None
    past = [sign * first > min_effect, sign * second > min_effect]
    if all(past):
        return None
    where = "the first half only" if past[0] else "the second half only" if past[1] else "neither half alone"
    bound = f"{'+' if direction == 'lower' else '-'}{min_effect:g}%"
    return (
        f"past the minimum effect {bound} in {where}: first half {first:+.1f}%, second half {second:+.1f}%; "
        "held as a possible transient"
    )
