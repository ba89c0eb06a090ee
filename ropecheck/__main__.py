"""The ``ropecheck`` command (``python -m ropecheck`` and the installed script).

It imports torch and the loaders, forks the zygote its workers are forked from
(``ropecheck.calling.spawn``) and starts the target's worker, then imports the CLI: the
worker loads its target while ropecheck's CLI imports.
"""

import sys


def main() -> None:
    from ropecheck.calling import memory, spawn

    memory.keep_freed_memory()
    with memory.importing():
        spawn.prestart(sys.argv[1:], preload=("ropecheck.session.loading",))
        from ropecheck.cli import entry
    entry()


if __name__ == "__main__":
    main()
