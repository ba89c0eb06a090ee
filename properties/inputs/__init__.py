"""The inputs of the laws, above the core: the Case record and its memory layouts, the
hypothesis strategies that draw Cases, and the fixed inputs every run tries."""
