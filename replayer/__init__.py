"""replayer: trace-replay load generator for LLM inference servers.

Importing the package does nothing beyond defining names (no loop, no registry, no I/O).
"""

__version__ = "0.1.0"
