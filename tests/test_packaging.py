"""What an install puts in site-packages: the ``ropecheck`` package alone, with the
repository's ``properties/`` and ``reference/`` folders inside it as
``ropecheck.properties`` and ``ropecheck.reference`` (pyproject.toml's package-dir), so a
project's own ``properties`` or ``reference`` package is never shadowed, nor shadows ours."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_holds_only_the_ropecheck_package(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--disable-pip-version-check", "-q", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("ropecheck-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top == {"ropecheck"}
    # every package folder of the repository is in it, where the API expects it
    folders = {"properties": "ropecheck/properties", "reference": "ropecheck/reference", "ropecheck": "ropecheck"}
    for folder, installed in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            inside = init.relative_to(ROOT / folder).as_posix()
            assert f"{installed}/{inside}" in names, f"{folder}/{inside} is not in the wheel"
    assert "ropecheck/properties/test_properties.py" in names
    assert "ropecheck/session/known_failures.toml" in names
