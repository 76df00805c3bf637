"""replayer: trace-replay load generator for LLM inference servers.

Importing the package does nothing beyond defining names (no loop, no registry, no I/O). The
stages live in subpackages (``core``, ``trace``, ``plan``, ``payload``, ``http``, ``send``,
``record``, ``observe``, ``results``, ``config``, ``run``, ``cli``; ``capture`` and ``sim``
beside). What users import is ``replayer.results``: results, samples and summaries, a stable API.
"""

# (nothing else at import time: the launcher's child process imports this package first)

__version__ = "0.1.0"
