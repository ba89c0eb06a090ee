"""The N-D families (image and video RoPE, M-RoPE, and 1-D RoPE as the one-axis case):
``checks`` holds the N-D checks and their inputs, ``families`` what each family (``axial``,
``mrope``, ``nd``) declares. Above the engine of ``ropecheck.properties`` (the runner, the
assertions, the error model), below the catalogue of every family."""
