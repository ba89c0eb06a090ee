"""The library interfaces a target is called through (``--api``), as the laws see them:
the ``Interface`` and ``Table`` records, and the context-parallel split of a call. Above the
inputs, below the families: it imports the core and the inputs only."""
