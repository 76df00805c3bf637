"""A package's facade without its import cost: ``facade(__name__, {name: module})`` gives the
module ``__getattr__`` that imports a name's module on first use (PEP 562). A package's
``__init__`` lists its public names this way (and imports them under ``TYPE_CHECKING`` for type
checkers), so importing one module of a package loads none of its siblings: the launcher's
child process and ``replayer sim`` start with only what they use."""

from __future__ import annotations

TYPE_CHECKING = False  # (typing is not imported: facades are loaded by the launcher's child too)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


def facade(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``exports`` maps each public name to its module,
    relative to the package (``".clock"``) or absolute. An unknown name raises AttributeError."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import importlib

        return getattr(importlib.import_module(module, package), name)

    return __getattr__
