"""``ropecheck bench``: the throughput of a RoPE kernel in its own interface, checked,
timed against the device's copy bandwidth and gated like accuracy.

- ``shapes``: the models' heads and the decode / prefill token counts timed;
- ``traffic``: the bytes each call must move (GB/s, and the copy it is compared with);
- ``runner``: one row: the output checked against the float64 reference, the call timed
  in blocks interleaved with the copy (``ropecheck.calling.timed`` in the target's process,
  ``ropecheck.timing`` for the timers and statistics), checked again on fresh inputs;
- ``gate``: a run against a saved one on the same device, or against another target;
- ``run``: a run from its options; ``output``: its table and its pytest-benchmark JSON.
"""
