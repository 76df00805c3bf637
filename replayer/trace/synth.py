"""Synthetic traces: seeded arrivals, lengths and controlled prefix sharing -> Trace batches.

Model (all draws from ``numpy.random.default_rng(seed)``, so the same spec gives the same rows):

* **Arrivals**: one process over all requests at ``rate_per_s``: Poisson (exponential gaps),
  gamma gaps with coefficient of variation ``cv`` (shape ``1/cv**2``, scale ``1/(rate * shape)``:
  mean gap ``1/rate``; cv 1 = Poisson, > 1 burstier), or constant (row ``k`` at exactly
  ``k/rate``). A rate of ``inf`` puts every row at time 0. The first request is at time 0;
  timestamps are integer nanoseconds, sorted.
* **Sessions**: rows come in groups of ``sessions`` concurrent conversations x ``turns`` turns;
  within a group the k-th arrival belongs to session ``k % sessions`` and is its turn
  ``k // sessions`` (conversations interleave, each turn after the previous one). Session ids are
  ``"s<n>"`` and ``turn`` the 0-based turn index (both only written when ``turns > 1``).
* **Lengths**: per turn, ``u`` new user tokens and ``o`` output tokens, from distributions
  (:func:`parse_dist`) or resampled as (input_length, output_length) pairs of a trace
  (``lengths_from``). Turn ``t`` of a session has ``input_length = S + sum_{k<t} (u_k + o_k) + u_t``
  (multi-turn growth: the history, answers included, is resent), capped at ``max_input_tokens``.
* **Shared system prompts**: each session uses prompt ``p`` (uniform in ``system_prompts``) of
  ``system_prompt_tokens`` tokens ``S``; its full blocks are shared by every session using ``p``.
* **Hash ids**: block ``j`` of a row is the system prompt's block ``p * (S // bs) + j`` when it lies
  entirely in the system prompt, else the session's own block ``base(session) + j`` (ids count up
  from ``system_prompts * (S // bs)``). A session's content only grows, so a turn's blocks are a
  prefix of the next turn's (a partial last block is a prefix of the full one). All ids < 2**62.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Iterator, cast

import numpy as np
import pyarrow.parquet as pq

from replayer.trace import ROW_GROUP_SIZE, Trace, TraceSource, read_trace, slice_rows, trace_table

__all__ = ["SynthSource", "SynthSpec", "load_spec", "parse_dist", "synth_batches", "synth", "write_synth"]


#: the largest token count a length distribution may name or draw (a draw above it is cut to it)
MAX_TOKENS = 1_000_000_000
#: the coefficient of variation a distribution may have: the gamma gaps' shape is ``1/cv**2``
#: (below ``MIN_CV`` the gaps are constant in effect: ``--arrival constant``; above ``MAX_CV``
#: nearly every gap is 0 and a few are years)
MIN_CV, MAX_CV = 1e-6, 100.0
#: the longest expected span of a synthetic trace (rows / rate), in seconds: ~31 years, far inside
#: int64 nanoseconds
MAX_SPAN_S = 1e9


def parse_dist(text: str):
    """``const:N`` | ``uniform:LO:HI`` (inclusive) | ``lognormal:MEAN:CV`` | ``normal:MEAN:SD`` |
    ``exp:MEAN`` -> ``f(rng, n) -> int64[n]`` (values in ``[1, MAX_TOKENS]``). Each parameter is
    checked against its range (a count at most ``MAX_TOKENS``, a CV at most ``MAX_CV``, an SD at
    most ``MAX_TOKENS``). Raises ValueError."""
    kind, *args = text.split(":")
    try:
        a = [float(x) for x in args]
    except ValueError:
        raise ValueError(f"bad distribution {text!r}: numbers expected after the name") from None
    need = {"const": 1, "uniform": 2, "lognormal": 2, "normal": 2, "exp": 1}
    if kind not in need or len(a) != need[kind]:
        raise ValueError(
            f"bad distribution {text!r}: expected const:N, uniform:LO:HI, lognormal:MEAN:CV, normal:MEAN:SD or exp:MEAN"
        )
    if any(not math.isfinite(x) or x < 0 for x in a):
        raise ValueError(f"bad distribution {text!r}: parameters must be finite and >= 0")
    if any(x > MAX_TOKENS for x in a):
        raise ValueError(f"bad distribution {text!r}: parameters must be at most {MAX_TOKENS:,} tokens")
    if kind == "lognormal" and a[1] > MAX_CV:
        raise ValueError(f"bad distribution {text!r}: CV must be at most {MAX_CV:g}")

    def clip(x):
        return np.clip(np.round(x), 1, MAX_TOKENS).astype(np.int64)

    if kind == "const":
        if round(a[0]) < 1:  # (a length of 0 tokens is no request: refused, not turned into 1)
            raise ValueError(f"bad distribution {text!r}: N must be >= 1")
        return lambda rng, n: np.full(n, int(round(a[0])), dtype=np.int64)
    if kind == "uniform":
        lo, hi = int(a[0]), int(a[1])
        if hi < lo:
            raise ValueError(f"bad distribution {text!r}: HI < LO")
        if hi < 1:
            raise ValueError(f"bad distribution {text!r}: HI must be >= 1")
        return lambda rng, n: np.maximum(1, rng.integers(lo, hi + 1, n)).astype(np.int64)  # (HI <= MAX_TOKENS)
    if kind in ("lognormal", "exp") and a[0] <= 0:
        raise ValueError(f"bad distribution {text!r}: MEAN must be > 0")
    if kind == "lognormal":
        mean, cv = a
        sigma = math.sqrt(math.log1p(cv * cv))
        mu = math.log(max(mean, 1e-9)) - sigma * sigma / 2
        return lambda rng, n: clip(rng.lognormal(mu, sigma, n))
    if kind == "normal":
        return lambda rng, n: clip(rng.normal(a[0], a[1], n))
    return lambda rng, n: clip(rng.exponential(a[0], n))


@dataclass(frozen=True)
class SynthSpec:
    """What to generate (see the module docstring). Rates in requests/s, lengths in tokens."""

    rows: int
    rate_per_s: float  # inf: every row at time 0
    arrival: str = "poisson"  # or "gamma", "constant"
    cv: float = 1.0
    input_dist: str = "lognormal:1024:1.0"
    output_dist: str = "lognormal:256:0.8"
    lengths_from: str | None = None
    system_prompts: int = 0
    system_prompt_tokens: int = 0
    turns: int = 1
    sessions: int = 1
    max_input_tokens: int | None = None
    block_size: int = 512
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def check(self, names: dict[str, str] | None = None) -> None:
        """Raises ValueError listing every bad field; ``names`` maps field names to what the
        caller calls them (the CLI's flags)."""

        def n(field_name: str) -> str:
            return (names or {}).get(field_name, field_name)

        problems = []
        if self.rows < 1:
            problems.append(f"{n('rows')} must be >= 1, got {self.rows}")
        if not self.rate_per_s > 0:  # (inf: every row at time 0)
            problems.append(f"{n('rate_per_s')} must be a number > 0 or inf, got {self.rate_per_s}")
        elif self.rows >= 1 and self.rows / self.rate_per_s > MAX_SPAN_S:
            problems.append(
                f"{n('rate_per_s')} {self.rate_per_s:g} is too slow: {self.rows:,} rows would span "
                f"{self.rows / self.rate_per_s:.3g} s, more than {MAX_SPAN_S:g} s"
            )
        if self.arrival not in ARRIVALS:
            problems.append(f"{n('arrival')} must be poisson, gamma or constant, got {self.arrival!r}")
        if not (MIN_CV <= self.cv <= MAX_CV):  # (nan too)
            problems.append(
                f"{n('cv')} must be between {MIN_CV:g} and {MAX_CV:g}, got {self.cv:g} (gamma gaps of shape "
                "1/cv^2; a smaller cv is constant gaps in effect: --arrival constant)"
            )
        if self.turns < 1 or self.sessions < 1:
            problems.append(f"{n('turns')} and {n('sessions')} must be >= 1")
        if (
            self.system_prompts < 0
            or self.system_prompt_tokens < 0
            or (self.system_prompts == 0) != (self.system_prompt_tokens == 0)
        ):
            problems.append(f"{n('system_prompts')} and {n('system_prompt_tokens')} must both be 0 or both be >= 1")
        if self.system_prompt_tokens > MAX_TOKENS:
            problems.append(f"{n('system_prompt_tokens')} must be at most {MAX_TOKENS:,}")
        if self.block_size < 1:
            problems.append(f"{n('block_size')} must be >= 1, got {self.block_size}")
        if self.max_input_tokens is not None and self.max_input_tokens < 1:
            problems.append(f"{n('max_input_tokens')} must be >= 1")
        for field_name in ("input_dist", "output_dist"):
            try:
                parse_dist(getattr(self, field_name))
            except ValueError as e:
                problems.append(f"{n(field_name)}: {e}")
        if problems:
            raise ValueError("; ".join(problems))


#: the arrival processes (see the module docstring)
ARRIVALS = ("poisson", "gamma", "constant")


def _gaps(spec: SynthSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    if spec.arrival == "poisson":
        return rng.exponential(1.0 / spec.rate_per_s, n)
    k = 1.0 / (spec.cv * spec.cv)
    return rng.gamma(k, 1.0 / (spec.rate_per_s * k), n)


def _arrivals(spec: SynthSpec, rng: np.random.Generator, start: int, n: int, t_now: float) -> tuple[np.ndarray, float]:
    """Timestamps (ns) of rows ``start .. start+n-1`` and the time (s) of the last one; ``t_now``
    is the previous batch's last time. Constant arrivals are computed from the row number, not
    summed, so row ``k`` is at exactly ``round(k * 1e9 / rate)`` ns however many rows come before."""
    if spec.arrival == "constant":
        times = np.arange(start, start + n, dtype=np.float64) / spec.rate_per_s
        return np.round(times * 1e9).astype(np.int64), float(times[-1])
    gaps = _gaps(spec, rng, n)
    if start == 0:
        gaps[0] = 0.0
    times = t_now + np.cumsum(gaps)
    if not times[-1] * 1e9 < 2**63:  # (a very bursty draw, far past MAX_SPAN_S: never a wrapped time)
        raise ValueError(f"the arrivals run past int64 nanoseconds ({times[-1]:.3g} s); give a lower cv or more rate")
    return np.round(times * 1e9).astype(np.int64), float(times[-1])


def synth_batches(spec: SynthSpec, *, chunk_rows: int = ROW_GROUP_SIZE) -> Iterator[Trace]:  # noqa: PLR0915
    """Generate ``spec.rows`` rows as consecutive Trace batches (each about ``chunk_rows`` rows,
    a whole number of session groups); times are offsets from the first row. ValueError for a bad spec."""
    spec.check()
    rng = np.random.default_rng(spec.seed)
    u_dist, o_dist = parse_dist(spec.input_dist), parse_dist(spec.output_dist)
    pairs = None
    if spec.lengths_from:
        src = read_trace(spec.lengths_from)
        pairs = (np.array(src.input_length), np.array(src.output_length))
    bs = spec.block_size
    C, T = spec.sessions, spec.turns
    S = spec.system_prompt_tokens
    sys_blocks = S // bs
    next_id = spec.system_prompts * sys_blocks
    group = C * T
    groups_per_chunk = max(1, chunk_rows // group)
    t_now = 0.0
    done = 0
    session_base = 0
    while done < spec.rows:
        n = min(groups_per_chunk * group, spec.rows - done)
        g = -(-n // group)  # groups in this chunk (the last may be cut short)
        full = g * group
        if pairs is not None:
            pick = rng.integers(0, pairs[0].size, full)
            u, o = pairs[0][pick], pairs[1][pick]
        else:
            u, o = u_dist(rng, full), o_dist(rng, full)
        # shape (g, T, C): row k of group gi is turn k // C of session k % C
        u3, o3 = u.reshape(g, T, C), o.reshape(g, T, C)
        hist = np.cumsum(u3 + o3, axis=1) - (u3 + o3)
        prompt = (
            rng.integers(0, spec.system_prompts, (g, 1, C)) if spec.system_prompts else np.zeros((g, 1, C), np.int64)
        )
        L = S + hist + u3
        if spec.max_input_tokens is not None:
            L = np.minimum(L, spec.max_input_tokens)
        L = L.reshape(-1)[:n].astype(np.int64)
        sess_local = np.tile(np.arange(C), g * T)[:n] + np.repeat(np.arange(g), group)[:n] * C
        nb = (L + (bs - 1)) // bs
        # per session: room for its largest row's blocks
        max_nb = np.zeros(g * C, dtype=np.int64)
        np.maximum.at(max_nb, sess_local, nb)
        base = next_id + np.concatenate([[0], np.cumsum(max_nb)[:-1]])
        next_id += int(max_nb.sum())
        offs = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(nb, out=offs[1:])
        row_of = np.repeat(np.arange(n), nb)
        j = np.arange(offs[-1], dtype=np.int64) - offs[:-1][row_of]
        s_of = sess_local[row_of]
        p_of = prompt.reshape(-1)[s_of]
        ids = np.where(j < sys_blocks, p_of * sys_blocks + j, base[s_of] + j)
        ts, t_now = _arrivals(spec, rng, done, n, t_now)
        sid: list[str | None] | None = None
        turn: list[int | None] | None = None
        if T > 1:
            sid = [f"s{session_base + k}" for k in sess_local.tolist()]
            # row k of a group is turn k // C
            turn = cast("list[int | None]", ((np.arange(n) % group) // C).tolist())
        session_base += g * C
        yield Trace(
            path="synthetic",
            timestamp_ns=ts,
            input_length=L,
            output_length=o.reshape(-1)[:n].astype(np.int64),
            hash_offsets=offs,
            hash_values=ids.astype(np.int64),
            block_size=bs,
            source_row=np.arange(done + 1, done + n + 1, dtype=np.int64),
            rows_out_of_order=0,
            session_id=sid,
            turn=turn,
            metadata={"format": "synthetic", "block_size": str(bs)},
            row_offset=done,
        )
        done += n


def _concat(batches: list[Trace]) -> Trace:
    offs = [np.asarray(b.hash_offsets) for b in batches]
    shift = np.cumsum([0] + [int(o[-1]) for o in offs[:-1]])
    hash_offsets = np.concatenate([offs[0][:1]] + [o[1:] + s for o, s in zip(offs, shift)])
    # (every batch has them, or none: turns > 1)
    sess = None if batches[0].session_id is None else [s for b in batches for s in b.session_id or ()]
    turn = None if batches[0].turn is None else [x for b in batches for x in b.turn or ()]
    b0 = batches[0]
    return Trace(
        path=b0.path,
        timestamp_ns=np.concatenate([b.timestamp_ns for b in batches]),
        input_length=np.concatenate([b.input_length for b in batches]),
        output_length=np.concatenate([b.output_length for b in batches]),
        hash_offsets=hash_offsets,
        hash_values=np.concatenate([b.hash_values for b in batches]),
        block_size=b0.block_size,
        source_row=np.concatenate([b.source_row for b in batches]),
        rows_out_of_order=0,
        session_id=sess,
        turn=turn,
        metadata=dict(b0.metadata),
    )


def synth(spec: SynthSpec) -> Trace:
    """The whole synthetic trace in memory (see :func:`synth_batches`)."""
    return _concat(list(synth_batches(spec)))


def describe(spec: SynthSpec) -> str:
    return (
        f"synthetic: {spec.rows} rows, {spec.arrival} arrivals at {spec.rate_per_s:g}/s (cv {spec.cv:g}), "
        f"input {spec.lengths_from or spec.input_dist}, output {spec.lengths_from or spec.output_dist}, "
        f"{spec.system_prompts} system prompts x {spec.system_prompt_tokens} tokens, "
        f"{spec.sessions} sessions x {spec.turns} turns, seed {spec.seed}"
    )


def write_synth(spec: SynthSpec, path: str | os.PathLike, *, row_group_rows: int = ROW_GROUP_SIZE) -> int:
    """Generate and write canonical Parquet (ns timestamps, zstd, one row group per batch) without
    holding the whole trace; returns the number of rows. Written to a temp name, then renamed."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    writer = None
    rows = 0
    try:
        for b in synth_batches(spec, chunk_rows=row_group_rows):
            table = trace_table(b, time_unit="ns", source=describe(spec), license="generated (no license needed)")
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema, compression="zstd")
            writer.write_table(table, row_group_size=max(row_group_rows, table.num_rows))
            rows += table.num_rows
        assert writer is not None  # rows >= 1: one batch at least
        writer.close()
        writer = None
        os.replace(tmp, path)
    finally:
        if writer is not None:
            writer.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
    return rows


def load_spec(
    *,
    num_prompts: int,
    request_rate: float,
    burstiness: float = 1.0,
    input_len: int,
    output_len: int,
    prefix_len: int = 0,
    range_ratio: float = 0.0,
    block_size: int,
    seed: int = 0,
) -> SynthSpec:
    """The spec of a load given as ``vllm bench serve`` gives it (``replayer run --request-rate``).

    * Arrivals at ``request_rate`` requests/s (inf: all at once): gamma gaps of shape
      ``burstiness`` and scale ``1/(request_rate * burstiness)`` (vLLM's), i.e. mean ``1/rate`` and
      coefficient of variation ``1/sqrt(burstiness)``; burstiness 1 is Poisson (exponential gaps)
      and an infinite burstiness is constant gaps of exactly ``1/rate``.
    * Lengths: ``input_len`` tokens after the shared prefix and ``output_len`` tokens; with
      ``range_ratio`` r, each drawn uniformly from ``[floor(L * (1 - r)), ceil(L * (1 + r))]``
      (vLLM's random dataset).
    * ``prefix_len`` leading tokens shared by every request (vLLM's ``--random-prefix-len``): one
      system prompt whose whole ``block_size`` blocks carry the same hash ids in every row, so a
      prefix cache sees them; a partial last block is the request's own (prompt length =
      ``prefix_len + input_len``).
    """
    if math.isinf(burstiness):
        arrival, cv = "constant", 1.0
    elif burstiness == 1.0:
        arrival, cv = "poisson", 1.0
    else:
        arrival, cv = "gamma", 1.0 / math.sqrt(burstiness)
    return SynthSpec(
        rows=num_prompts,
        rate_per_s=request_rate,
        arrival=arrival,
        cv=cv,
        input_dist=_length_dist(input_len, range_ratio),
        output_dist=_length_dist(output_len, range_ratio),
        system_prompts=1 if prefix_len else 0,
        system_prompt_tokens=prefix_len,
        block_size=block_size,
        seed=seed,
    )


def _length_dist(length: int, range_ratio: float) -> str:
    if not range_ratio:
        return f"const:{length}"
    return f"uniform:{max(1, math.floor(length * (1 - range_ratio)))}:{math.ceil(length * (1 + range_ratio))}"


class SynthSource(TraceSource):
    """A synthetic trace opened as a :class:`TraceSource`: the rows of ``spec``, generated again
    on every pass (the same spec gives the same rows, so every pass, loop, shard and resumed
    run sees one schedule) and never held whole. The rows are generated in batches of
    ``ROW_GROUP_SIZE`` rows and cut to ``max_rows``, so they do not depend on the batch size
    asked for, and equal what ``trace synth`` writes for the same spec."""

    def __init__(self, spec: SynthSpec) -> None:
        spec.check()
        self.spec = spec
        self.path = "synthetic"
        self.num_rows = spec.rows
        self.metadata = {"format": "synthetic", "block_size": str(spec.block_size)}
        self.block_size = spec.block_size

    def batches(self, max_rows: int = 65_536) -> Iterator[Trace]:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        for b in synth_batches(self.spec):
            for a in range(0, len(b), max_rows):
                yield slice_rows(b, a, min(len(b), a + max_rows))

    def span_ns(self, rows: int | None = None) -> int | None:
        """Known without generating the rows for constant arrivals (and an infinite rate)."""
        k = min(self.spec.rows, rows or self.spec.rows)
        if math.isinf(self.spec.rate_per_s):
            return 0
        if self.spec.arrival == "constant":
            return round((k - 1) * 1e9 / self.spec.rate_per_s)
        return None

    def validate(self) -> None:
        """Nothing to check: the rows are valid by construction (the spec was checked)."""

    def _iter(self, max_rows: int, problems: list | None) -> Iterator[Trace]:
        return self.batches(max_rows)
