"""Reading input rows lazily: text, CSV/TSV, JSONL, stdin, or URLs given directly."""

from swarmget.sources.reader import read_rows
from swarmget.sources.rows import Row

__all__ = ["Row", "read_rows"]
