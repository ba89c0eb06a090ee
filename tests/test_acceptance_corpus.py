"""The acceptance corpus (acceptance/corpus.py) stays loadable: acceptance/run.py runs it
outside CI's time budget, so a broken entry would otherwise show only there."""

from __future__ import annotations

import importlib.util
from pathlib import Path

CORPUS = Path(__file__).resolve().parent.parent / "acceptance" / "corpus.py"


def test_every_entry_is_a_command_line():
    spec = importlib.util.spec_from_file_location("acceptance_corpus", CORPUS)
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    assert corpus.CHECKS and corpus.IDENTIFY
    for name, words in corpus.CHECKS.items():
        assert isinstance(name, str) and words and all(isinstance(w, str) for w in words), name
