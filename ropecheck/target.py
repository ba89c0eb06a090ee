"""``ropecheck.target``: the name this module had before the harness had layers; target
files written for it keep working. New code imports ``ropecheck.targets``."""

from ropecheck.targets.target import Convention, Target  # noqa: F401

__all__ = ["Convention", "Target"]
