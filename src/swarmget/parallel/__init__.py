"""The supervisor and its backends: one engine in this process, or one per core.

See :mod:`swarmget.parallel.supervisor` for how the work is split and
:mod:`swarmget.parallel.backend` for the seam between the two.
"""

from swarmget.parallel.workers import worker_count, worker_shares

__all__ = ["worker_count", "worker_shares"]
