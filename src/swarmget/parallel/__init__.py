"""More than one event loop: one worker process per core, fed by a parent.

See :mod:`swarmget.parallel.supervisor` for how the work is split.
"""

from swarmget.parallel.supervisor import run_parallel, worker_count

__all__ = ["run_parallel", "worker_count"]
