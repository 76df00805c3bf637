"""A run's folder read strictly, for the commands that judge it (``compare --gate``,
``history``): every results file whole and its ``summary.json`` parsed, or an error naming the
file that is not. ``read_results`` and ``read_summary`` are lenient on purpose (a report of a
crashed run reads what is there); a verdict over part of a run's requests, or over a summary
that is not one, would judge another run than the one named, so these refuse instead."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq


def summary_of(folder: str) -> dict | None:
    """The folder's ``summary.json`` as a dict, None when it has none (a killed run). Raises
    ValueError naming the file when it cannot be read or is not a JSON object, as ``replayer
    compare`` does (removing it has the run summarized from its results files)."""
    path = os.path.join(folder, "summary.json")
    if not os.path.exists(path):
        return None
    s = read_json_file(path)
    if not isinstance(s, dict):
        raise ValueError(
            f"{path}: not a summary.json (not a JSON object): remove it and the run is summarized from its results files"
        )
    return s


def read_json_file(path: str) -> object:
    """A summary.json file's JSON value. Raises ValueError naming the file when it cannot be
    read (FileNotFoundError as it is) or is not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(
            f"{path}: not a summary.json (not JSON): remove it and the run is summarized from its results files"
        ) from None


def results_of(folder: str, columns: list[str], name: str = "run") -> pa.Table:
    """Every request of the results folder (the ``columns`` of them it has), each results file
    read whole. Raises ValueError naming a file that cannot be read (cut short, not Parquet): the
    ``name`` run's requests would not all be there."""
    from replayer.record import result_files

    tables = []
    for path in result_files(folder):
        try:
            pf = pq.ParquetFile(path)
            have = [c for c in columns if c in pf.schema_arrow.names]
            tables.append(pf.read(columns=have).replace_schema_metadata(None))
        except (OSError, pa.ArrowException) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(
                f"{path}: damaged results file, cannot read it ({why}): the {name}'s requests are not all there"
            ) from None
    if not tables:
        raise ValueError(f"{folder}: no results files (requests*.parquet): not a results folder")
    return pa.concat_tables(tables, promote_options="default")
