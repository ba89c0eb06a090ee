"""The lowest layer of the laws: the dtypes, the fp8 formats, the sizes inputs are drawn at,
and the contract between the laws and the harness (the call forms, what a check reads of a
target, how a call can fail). It imports nothing of the project but ``ropecheck.reference``."""
