"""The regression gate's inputs: both runs read (``replayer.results.runread``: every results
file whole, the summary parsed, or an error naming the file), and what is checked before their
requests are paired: the same experiment (speed-up, model, the trace files named when the
pairing finds other requests), each run's faithfulness to its trace, and the goodput bounds both
runs are judged by. What is compared all the same but must be said (a run not faithful under
``require_faithful: false``, a run its own host slowed, other ``--goodput`` bounds in the two
runs) is collected as ``warnings``, which every output of the gate carries."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pyarrow as pa

from replayer.results.gate import COLUMNS, NotComparable, Paired, pair
from replayer.results.gatespec import GateSpec
from replayer.results.gatestall import client_late


@dataclass
class Inputs:
    """Both runs paired, the goodput bounds (ms) and where they came from, and what to warn of;
    ``slowed`` names the runs their own host slowed (``gate.guard``)."""

    paired: Paired
    slos: dict[str, float]
    slos_from: str | None
    warnings: list[str] = field(default_factory=list)
    slowed: list[str] = field(default_factory=list)


def read_run(path: str, name: str) -> tuple[pa.Table, dict]:
    """Run ``path``'s requests (the gate's columns) and summary ({} when it has none: its setup
    from its results files' metadata). Raises ValueError naming what is not a run or is damaged."""
    from replayer.record import result_files
    from replayer.results.compare import setup_of
    from replayer.results.runread import results_of, summary_of

    folder = os.path.dirname(path) if path.endswith("summary.json") and not os.path.isdir(path) else path
    if not os.path.isdir(folder):
        raise ValueError(f"{path}: no such results folder")
    files = result_files(folder)
    if not files:
        raise ValueError(f"{path}: no results files (requests*.parquet): not a results folder")
    table = results_of(folder, COLUMNS, name)
    summary = summary_of(folder)
    if summary is None:
        try:
            summary = setup_of(files[0])
        except (OSError, ValueError):
            summary = {}
    return table, summary


def unfaithful(name: str, s: dict, max_lag_ms: float = 25.0) -> str | None:
    """Why run ``name`` (its summary) did not replay its trace faithfully, or None: its
    ``fidelity`` verdict when it has one, else its dispatch lag p99 against ``max_lag_ms`` (a run
    that fell behind measured the load generator's host as much as the server)."""
    fid = s.get("fidelity")
    if isinstance(fid, dict) and fid.get("verdict") == "not_faithful":
        return f"the {name} was not faithful to its trace: {'; '.join(map(str, fid.get('reasons') or [])) or 'see its summary'}"
    lag = s.get("dispatch_lag_p99_ms")
    if not isinstance(fid, dict) and isinstance(lag, (int, float)) and lag > max_lag_ms:
        return f"the {name} fell behind its trace: dispatch lag p99 {lag:.1f} ms, over {max_lag_ms:g} ms"
    return None


def bounds_text(slos: dict[str, float]) -> str:
    """Goodput bounds as ``--goodput`` spells them (``ttft:240 e2el:20000``), "none" for none."""
    return " ".join(f"{k}:{v:g}" for k, v in slos.items()) or "none"


def own_bounds(s: dict) -> dict[str, float]:
    """A run's own ``--goodput`` bounds (ms) from its summary ({} for none)."""
    slos = s.get("goodput_slos_ms")
    return {str(k): float(v) for k, v in slos.items()} if isinstance(slos, dict) else {}


def goodput_bounds(gate: GateSpec, sb: dict, sc: dict) -> tuple[dict[str, float], str | None, list[str]]:
    """The bounds goodput is judged by in both runs (the gate file's, else the baseline's, else
    the candidate's), where they came from, and a warning when the runs' own bounds differ: the
    gate judges both by one set, not each run by its own."""
    from replayer.results.verdict import parse_goodput

    base, cand = own_bounds(sb), own_bounds(sc)
    if gate.goodput:
        slos, source = parse_goodput(gate.goodput), f"the gate file {gate.source}"
    elif base or cand:
        slos, source = (base, "the baseline's --goodput") if base else (cand, "the candidate's --goodput")
    else:
        return {}, None, []
    warnings = []
    if base != cand:
        warnings.append(
            f"the runs' own --goodput bounds differ: {bounds_text(base)} in the baseline, {bounds_text(cand)} "
            f"in the candidate; goodput is judged by {bounds_text(slos)} in both, from {source}"
        )
    return slos, source, warnings


def _same_setup(sb: dict, sc: dict) -> None:
    for key, label in (("speedup", "speed-ups"), ("model", "models")):
        if key in sb and key in sc and sb[key] != sc[key]:
            raise NotComparable(f"different {label}: {sb[key]} in the baseline, {sc[key]} in the candidate")


def _paired(tb: pa.Table, tc: pa.Table, sb: dict, sc: dict) -> Paired:
    """``gate.pair``, its refusal naming the runs' trace files and speed-ups where they differ
    or are known: "different slices" alone does not say that another file was replayed."""
    try:
        return pair(tb, tc)
    except NotComparable as e:
        said = []
        tr_b, tr_c = sb.get("trace"), sc.get("trace")
        if tr_b and tr_c and tr_b != tr_c:
            said.append(f"the baseline replayed {tr_b}, the candidate {tr_c}")
        sp_b, sp_c = sb.get("speedup"), sc.get("speedup")
        if str(e).startswith("different schedules") and (sp_b is not None or sp_c is not None):
            said.append(
                f"speed-up {sp_b if sp_b is not None else 'unknown'} in the baseline, "
                f"{sp_c if sp_c is not None else 'unknown'} in the candidate"
            )
        raise NotComparable("; ".join([str(e), *said])) from None


def read_inputs(base: str, cand: str, gate: GateSpec, warnings: list[str]) -> Inputs:
    """Both runs read, checked and paired; what to warn of appended to ``warnings`` as it is
    found (kept when a later check refuses the pair). Raises ``NotComparable`` (or ValueError
    for a path that is not a readable run) with the reason."""
    (tb, sb), (tc, sc) = read_run(base, "baseline"), read_run(cand, "candidate")
    _same_setup(sb, sc)
    slowed: list[str] = []
    for name, summary in (("baseline", sb), ("candidate", sc)):
        why = unfaithful(name, summary, gate.max_dispatch_lag_ms)
        late = client_late(name, summary, gate.max_dispatch_lag_ms, gate.max_client_lag_ms) if why else None
        if late:  # (judged, its tails not: gatestall)
            slowed.append(late)
            warnings.append(f"{late}; its tails are not judged")
        elif why and gate.require_faithful:
            raise NotComparable(why + "; require_faithful: false in a gate file compares it all the same")
        elif why:
            warnings.append(f"{why}; compared all the same (require_faithful: false)")
    paired = _paired(tb, tc, sb, sc)
    slos, source, differ = goodput_bounds(gate, sb, sc)
    warnings += differ
    return Inputs(paired, slos, source, warnings, slowed)
