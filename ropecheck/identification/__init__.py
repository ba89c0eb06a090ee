"""``ropecheck identify``: a target's convention inferred by probing it as a black box."""
