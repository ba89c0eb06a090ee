"""N-D adapters: adapter name -> the ``ropecheck check --family`` flags its target implies
(family, sections, layout, axes). The records themselves are ordinary ``Adapter``s."""

ND_ADAPTERS: dict[str, dict] = {}
