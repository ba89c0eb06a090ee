"""``python -m ropecheck``: the same CLI as the ``ropecheck`` command."""

from ropecheck.cli import main

main(prog_name="ropecheck")
