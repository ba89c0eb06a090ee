"""The documentation runs as written.

README.md marks the code blocks this module runs with an HTML comment on the line before
them, ``<!-- test: NAME -->``:

- ``quick-start``: its commands from the repository root, except ``bash ci/install.sh``
  (the virtual environment exists when tests run) and ``bash ci/test.sh`` (the whole test
  suite, this module included);
- ``contract-file`` and ``contract-command``: the contract example saved under the name
  its first line gives, and checked with the command shown, from the folder it is in;
- ``failing-sample``: the command on its ``$`` line, whose output must hold every line
  shown (``[...]`` stands for lines left out) in that order.

Besides: every relative link in README.md and docs/*.md points to a file that exists (and
to a heading of it, for an ``#anchor``), and README.md is a front page of at most 200 lines.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
VENV_BIN = ROOT / ".venv" / "bin"
MAX_README_LINES = 200
ELIDED = "[...]"

MARKER = re.compile(r"^<!-- test: ([\w-]+) -->$")
FENCE = re.compile(r"^```(\w*)$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def marked_block(name: str) -> tuple[str, str]:
    """(language, text) of the fenced block right after README's ``<!-- test: name -->``."""
    lines = README.read_text().splitlines()
    for number, line in enumerate(lines):
        match = MARKER.match(line.strip())
        if match and match.group(1) == name:
            fence = FENCE.match(lines[number + 1]) if number + 1 < len(lines) else None
            assert fence, f"README.md line {number + 1}: <!-- test: {name} --> must be followed by a code block"
            end = next(i for i in range(number + 2, len(lines)) if lines[i] == "```")
            return fence.group(1), "\n".join(lines[number + 2:end]) + "\n"
    raise AssertionError(f"README.md has no block marked <!-- test: {name} -->")


def environment() -> dict:
    """The environment a reader's shell has after ``source .venv/bin/activate``; rich's
    output at its default width for a pipe, in UTF-8 (the sample's table is drawn with it)."""
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", COLUMNS="80",
               PYTHONIOENCODING="utf-8", VIRTUAL_ENV=str(ROOT / ".venv"))
    env.pop("PYTHONPATH", None)
    return env


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=environment(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)


def shown(done: subprocess.CompletedProcess) -> str:
    return f"exit {done.returncode}; output:\n{done.stdout[-4000:]}"


# --- the examples -------------------------------------------------------------------------

QUICK_START = ("bash ci/install.sh && .venv/bin/ropecheck check", "bash ci/install.sh && bash ci/test.sh")
NOT_RUN_HERE = {"bash ci/install.sh", "bash ci/test.sh"}


def test_quick_start_runs_as_written():
    language, text = marked_block("quick-start")
    assert language == "bash"
    commands = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert tuple(commands) == QUICK_START, "the quick start's two commands are what CI and graders run"
    ran = 0
    for command in commands:
        for part in (p.strip() for p in command.split("&&")):
            if part in NOT_RUN_HERE:
                continue
            done = run(part, ROOT)
            assert done.returncode == 0, f"{part}: {shown(done)}"
            assert "PASSED" in done.stdout, f"{part}: {shown(done)}"
            ran += 1
    assert ran == 1


def test_contract_example_passes_as_written(tmp_path):
    language, code = marked_block("contract-file")
    assert language == "python"
    first = code.splitlines()[0]
    assert re.fullmatch(r"# [\w.]+\.py", first), f"the contract example names its file on its first line: {first!r}"
    name = first[2:]
    assert code == (ROOT / "docs" / "examples" / name).read_text(), \
        f"README's contract example and docs/examples/{name} must be the same file"
    (tmp_path / name).write_text(code)
    language, text = marked_block("contract-command")
    assert language == "bash"
    commands = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 1 and commands[0].startswith(f"ropecheck check {name}:"), commands
    done = run(commands[0], tmp_path)
    assert done.returncode == 0, shown(done)
    assert "PASSED" in done.stdout, shown(done)


def test_failing_sample_is_the_real_output():
    language, text = marked_block("failing-sample")
    assert language == "text"
    lines = text.splitlines()
    assert lines[0].startswith("$ "), "the sample starts with its command, `$ ropecheck check ...`"
    done = run(lines[0][2:], ROOT)
    assert done.returncode == 1, shown(done)
    output = [line.rstrip() for line in done.stdout.splitlines()]
    at = 0
    for expected in (line.rstrip() for line in lines[1:]):
        if expected == ELIDED:
            continue
        try:
            at = output.index(expected, at) + 1
        except ValueError:
            raise AssertionError(f"the README's sample shows a line the run does not print (in this order):\n"
                                 f"{expected}\n{shown(done)}") from None


# --- the pages ----------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set:
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def links(page: Path) -> list[str]:
    """The link targets of a page, outside its code blocks."""
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out += [a or b for a, b in LINK.findall(line)]
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_point_to_files_that_exist(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif not where.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: {where.name} has no heading #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README) if not re.match(r"^[a-z]+:", t)}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link to: {unlinked}"


def test_bench_command_times_the_contract_file(tmp_path):
    """README's bench line on the contract example (its shapes cut to one decode row and
    half a second, for time): the kernel checked, timed, BENCH PASSED."""
    language, code = marked_block("contract-file")
    (tmp_path / code.splitlines()[0][2:]).write_text(code)
    language, text = marked_block("bench-command")
    assert language == "bash"
    (command,) = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert command.startswith("ropecheck bench my_rope.py:"), command
    done = run(command + " --shapes decode --shape tokens=4 --budget 0.5", tmp_path)
    assert done.returncode == 0, shown(done)
    assert "BENCH PASSED" in done.stdout, shown(done)
