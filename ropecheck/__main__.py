"""The ``ropecheck`` command (``python -m ropecheck`` and the installed script).

It starts the target's worker process first, then imports the CLI: the worker's start-up
(and its import of the loaders) and ropecheck's imports overlap.
"""

import sys


def main() -> None:
    from ropecheck.calling import memory, spawn

    memory.keep_freed_memory()
    spawn.prestart(sys.argv[1:], preload=("ropecheck.session.loading",))
    from ropecheck.cli import entry

    entry()


if __name__ == "__main__":
    main()
