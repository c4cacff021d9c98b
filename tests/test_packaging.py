"""The wheel holds every file the package reads at run time: setuptools ships a non-Python file
under orthros/ only where pyproject's package-data names it (a CUDA C++ source the package built
at first use was once left out of the wheel while the editable install found it)."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def test_package_data_names_every_non_python_file():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["orthros"]
    package = ROOT / "orthros"
    shipped = {p for g in globs for p in package.glob(g) if p.is_file()}
    needed = {p for p in package.rglob("*")
              if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert needed, "no data files found under orthros/: the walk is wrong"
    missing = sorted(str(p.relative_to(ROOT)) for p in needed - shipped)
    assert not missing, f"not in pyproject's [tool.setuptools.package-data] (left out of the wheel): {missing}"


def test_the_version_is_one_figure():
    """pyproject.toml's version (the wheel's metadata, pip's) and ``orthros.__version__`` (``orthros --version``)
    are written in two places: they must say the same."""
    import orthros

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == orthros.__version__
