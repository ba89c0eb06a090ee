"""The timing core of ``ropecheck bench``: how fast a RoPE kernel is, and whether it got slower.

- ``timers``: one sample of a kernel's time per call, four ways: ``CpuTimer`` (the last-level
  cache flushed before each call), ``HostTimer`` (eager calls as a model pays for them: launch
  and Python overhead, warm caches), ``CudaColdTimer`` (one call between CUDA events after an
  L2 flush) and ``CudaGraphTimer`` (back-to-back calls replayed from a CUDA graph); the copy
  the kernel is measured against in the same run (``copy_call``), the empty call that
  measures launch time (``empty_call``) and the cache sizes the timers work from.
- ``sampling``: ``interleave`` takes samples from several arms (kernel, copy, baseline) in
  blocks, in an order shuffled per block, until the median settles or a limit is reached.
- ``stats``: distribution-free statistics: the confidence interval of a median from order
  statistics, the shift between two runs (Mann-Whitney U, Hodges-Lehmann with its Moses
  interval) and the gate a CI job fails on, and the drift of the copy over a run.
- ``records``: a run in pytest-benchmark's JSON format, so that ``pytest-benchmark compare``
  and the dashboards that read its files read a bench run.

Importing this package imports none of them (nor torch).
"""
