"""How results are shown and saved: the terminal table, failures, JSON and JUnit
(``output``), and the conformance report over every target (``conformance``, ``plots``)."""
