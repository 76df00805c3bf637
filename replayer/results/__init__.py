"""The public API for what a run wrote: the names below are stable, documented and what a user's
script imports (``from replayer.results import read_results``). The rest of this package (the
summary's fold, the verdict, report, compare, merge, the sweep page) is the results stage's own.

- ``read_results(path, columns=None)``: every request of a results folder (or one file) as one
  ``pyarrow.Table`` (schema ``SCHEMA``): rolled files and parts, each row once, damaged files
  named and left out;
- ``read_samples(results_dir)``: the target's scraped ``/metrics`` samples (a ``pyarrow.Table``,
  None when the run scraped none);
- ``read_summary(results_dir)``: the folder's ``summary.json`` as written at the end of the run;
- ``summarize_files(files, slos=None)``: the summary computed again from results files, in
  bounded memory (the fold retention and merge use); ``result_files(results_dir)`` lists them;
- ``summarize(table, slos=None)``: the same of a table in memory;
- ``SCHEMA``: the results files' Arrow schema (one row per request; docs/results.md).
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.core.result import SCHEMA
    from replayer.observe.target_samples import read_samples
    from replayer.record.folder import read_results, result_files
    from replayer.results.summary import read_summary, summarize, summarize_files

__all__ = ["SCHEMA", "read_results", "read_samples", "read_summary", "result_files", "summarize", "summarize_files"]
__getattr__ = facade(
    __name__,
    {
        "SCHEMA": "replayer.core.result",
        "read_results": "replayer.record.folder",
        "read_samples": "replayer.observe.target_samples",
        "read_summary": "replayer.results.summary",
        "result_files": "replayer.record.folder",
        "summarize": "replayer.results.summary",
        "summarize_files": "replayer.results.summary",
    },
)
