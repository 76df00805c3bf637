"""When a run sends: speed-up, concurrency cap, loops, sessions' pacing, shards, workers and the
fleet's coordinator (``RunConfig``'s "Schedule" settings).

``RunConfig`` (``replayer.config.model``) inherits ``PacingSettings`` with the other groups' settings;
the checks that relate settings of several groups stay there. Fields are in the order of
``replayer.config.groups.GROUPS`` under each heading.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = ["PacingSettings"]


class PacingSettings(BaseModel):
    """The "Schedule" settings of ``RunConfig``."""

    # -- Schedule
    speedup: float = Field(1.0, gt=0, description="replay this many times faster than the trace")
    max_concurrency: int | None = Field(
        None,
        ge=1,
        description="cap on requests in flight (vllm bench serve's): a due request waits for a slot, "
        "its wait in queue_wait_ms and in the latencies from due; unset = open loop",
    )
    max_requests: int | None = Field(
        None,
        ge=1,
        description="replay only the schedule's first N requests (shards and resumed runs together); unset = all",
    )
    duration_s: float | None = Field(
        None, gt=0, description="stop scheduling after this many seconds of replay; unset = all"
    )
    loop: str = Field("1", description="passes over the trace: a number, or 'forever'")
    loop_gap_s: float = Field(0.0, ge=0, description="trace time between the end of one loop and the next")
    loop_salt: bool = Field(
        False,
        description="fresh prefixes in every loop (salted prompt seed) "
        "instead of the same prefixes (warm server cache)",
    )
    idle_gap_cap_s: float | None = Field(
        None,
        gt=0,
        description="a gap between consecutive requests longer than "
        "this in replay time (after --speedup) shrinks to it; the summary "
        "reports gaps capped and time skipped; unset = no cap",
    )
    session_policy: str = Field(
        "wait",
        description="multi-turn sessions: wait (a turn goes at its trace "
        "time or at its predecessor's end plus think time, whichever is later), "
        "wait-no-think (ignore think time) or off (trace times only)",
    )
    start_at: float | None = Field(
        None,
        description="anchor the schedule at this Unix time (aligns shards; "
        "one more than 1 s past is not kept: the run starts now, out of step); unset = now",
    )
    start_delay_s: float = Field(0.1, ge=0, description="anchor the schedule this long after start-up")
    drain_timeout_s: float = Field(30.0, ge=0, description="on stop, wait this long for in-flight requests")
    shard: str = Field("0/1", description="I/N: send only shard I of N (0-based; sessions stay whole)")
    workers: int = Field(1, ge=1, le=64, description="processes on this host, one shard each (merged summary)")
    coordinator: str | None = Field(
        None,
        description="URL of `replayer coordinate`: wait until every shard is ready, start together on "
        "the coordinator's clock (this host's offset measured), report live; a restarted shard rejoins "
        "in step (needs --shard I/N); unset = start on its own (--start-at or now)",
    )
    rejoin_max_late_s: float = Field(
        1.0,
        ge=0,
        description="a shard (re)joining its fleet after the start sends rows at most this late; "
        "rows due earlier are recorded missed_while_down, not sent",
    )
    lead_s: float = Field(
        3.0,
        gt=0,
        le=60,
        description="build request bodies this far ahead of their due time (the first window before the run starts)",
    )
    launcher: bool = Field(
        True,
        description="write each request from a launcher process at its due time "
        "(plain HTTP; the event loop keeps reading the streams)",
    )
    delayed_ack: bool = Field(
        False,
        description="let the kernel delay this client's TCP ACKs during a "
        "response stream (TCP_QUICKACK off; Linux, elsewhere a no-op with a warning): half the ACKs, ~3.5 us less CPU per "
        "SSE event; only for servers that set TCP_NODELAY (vLLM, SGLang, uvicorn and "
        "aiohttp servers do): with Nagle on, each token would wait up to 40 ms",
    )

    @property
    def loops(self) -> int | None:
        """Number of passes over the trace (None = forever)."""
        return None if self.loop == "forever" else int(self.loop)

    @property
    def shard_index(self) -> tuple[int, int]:
        i, n = (int(x) for x in self.shard.split("/"))
        return i, n
