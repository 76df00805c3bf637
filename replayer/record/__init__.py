"""The results on disk: the writer (parts, rolls, the checkpoint), retention, and the folder's
readers (``folder``). No statistics.

The names below are this stage's facade (imported on first use); the modules are its own.
"""

from replayer.core.facade import facade

TYPE_CHECKING = False  # (no typing import: see replayer.core.facade)

if TYPE_CHECKING:
    from replayer.record.folder import read_removed, read_results, result_files
    from replayer.record.recorder import Recorder

__all__ = ["Recorder", "read_results", "result_files", "read_removed"]
__getattr__ = facade(
    __name__, {"Recorder": ".recorder", "read_results": ".folder", "result_files": ".folder", "read_removed": ".folder"}
)
