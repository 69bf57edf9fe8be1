"""What the package declares and ships: the license, ``py.typed`` and gymnasium, in the metadata and in
the built wheel."""

from __future__ import annotations

import subprocess
import sys

import pytest
from paths import REPO

# ----------------------------------------------------------------------------------- packaging


def test_license_types_and_gymnasium_are_declared():
    import tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]
    assert (REPO / "sppo_rl" / "py.typed").is_file()
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["sppo_rl"]
    assert any(
        d.startswith("gymnasium") for d in project["dependencies"]
    )  # `pip install sppo-rl` can run control


@pytest.mark.slow
def test_the_wheel_ships_license_types_and_gymnasium(tmp_path):
    import shutil
    import zipfile

    src = tmp_path / "src"  # a copy: building in place leaves build/ and *.egg-info in the repository
    shutil.copytree(REPO / "sppo_rl", src / "sppo_rl", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, timeout=300, capture_output=True)  # fmt: skip
    (wheel,) = tmp_path.glob("sppo_rl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "sppo_rl/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert "sppo_rl/recipes/grpo-7b-dapo.json" in names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta and "Requires-Dist: gymnasium<2,>=1.1\n" in meta
