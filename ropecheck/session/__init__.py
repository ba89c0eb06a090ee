"""The check session: the option table (``options``), from options to a declared target
(``spec``), the one preparation path (``prepare``), the session that runs a target's
properties (``session``), and known failures as data (``known_failures``)."""
