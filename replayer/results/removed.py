"""What is kept of the results files retention removes: their summary fold as JSON, in the
folder's ``removed.json`` (``replayer.record.folder.Removed.fold_json``), so every summary
still counts them, with the drift windows and the fidelity figures of the files removed (the
verdicts of a soak cover the whole run). ``digest_file`` is the ``retention.Digest`` the run gives the recorder."""

from __future__ import annotations

from replayer.results.driftdigest import digest_drift
from replayer.results.fidelitydigest import digest_fidelity
from replayer.results.foldjson import fold_from_json, fold_to_json, jsonable
from replayer.results.summary import fold_file


def digest_file(path: str, fold_json: dict | None) -> dict | None:
    """``retention.Digest``: the results of ``path`` folded into ``fold_json`` (None: none yet), as
    JSON; None when ``path`` holds no readable results. Its ``drift`` key: the drift verdict's
    windows of the files removed (``driftdigest.digest_drift``); its ``fidelity`` key: the fidelity
    verdict's figures of the files removed (``fidelitydigest.digest_fidelity``)."""
    fold = fold_file(path)
    if fold is None:
        return None
    if fold_json is not None:
        old = fold_from_json(fold_json)
        old.merge(fold)
        fold = old
    out = jsonable(fold_to_json(fold))
    drift = digest_drift(path, (fold_json or {}).get("drift"))
    if drift is not None:
        out["drift"] = jsonable(drift)
    fidelity = digest_fidelity(path, (fold_json or {}).get("fidelity"))
    if fidelity is not None:
        out["fidelity"] = fidelity  # (JSON already: Python numbers and lists, its pending times many)
    return out
