"""``python -m swarmget`` and the ``swarmget`` script."""

import contextlib
import sys


def run() -> int:
    """Import the CLI and run it; a Ctrl-C while importing exits quietly, as later."""
    try:
        from swarmget.cli import main
    except KeyboardInterrupt:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write("swarmget: interrupted\n")
        return 130  # cli.EXIT_INTERRUPTED, not imported: the import was interrupted
    return main()


if __name__ == "__main__":
    raise SystemExit(run())
