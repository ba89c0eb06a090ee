"""Targets: the one ``Target`` record (``target``) and the built-ins (``builtins``,
``triton_builtins``). The third-party adapters are ``ropecheck.adapters``; the loader
that resolves a name is ``ropecheck.session.loading``."""

from ropecheck.targets.target import Convention, Target  # noqa: E402,F401  (what a target file declares)

__all__ = ["Convention", "Target"]
