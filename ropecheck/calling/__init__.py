"""The calling layer: how a target is called under the contract, wherever it runs.

- ``forms``: the call forms (x, qk, packed), made of one canonical call;
- ``execution``: one call (a ``Request``) in the process that runs the target, recorded as
  an ``Outcome``; ``devices`` and ``modes``: where its inputs are made and how it is run;
- ``in_process`` and ``worker`` (with ``spawn``): the two executors, this process and a
  worker process that a crash or a hang cannot take ropecheck down with;
- ``caller``: the ``Caller`` the checks call (``properties.core.contract.Rope``), which hands
  requests to an executor and checks what comes back.
"""
