"""``python -m ropecheck``: the same CLI as the ``ropecheck`` command."""

from ropecheck.cli import entry

entry()
