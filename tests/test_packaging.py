"""The package as shipped: typed, versioned, licensed, with pinned image dependencies."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import metadata, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from github_broker import __version__

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_sdk_is_typed() -> None:
    assert (ROOT / "github_broker" / "py.typed").exists()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["github_broker"]


def test_one_version_everywhere() -> None:
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert version("github-broker") == __version__
    assert f"## [{__version__}]" in (ROOT / "CHANGELOG.md").read_text()


def test_license_and_classifiers() -> None:
    meta = metadata("github-broker")
    assert meta["License-Expression"] == "MIT"
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers


def test_constraints_pin_every_runtime_dependency() -> None:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            assert pinned, f"{line!r} is not an exact pin"
            pins[canonicalize_name(name)] = pinned
    for dep in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in constraints.txt: run `make constraints`"
        assert req.specifier.contains(pins[name]), f"{req.name}=={pins[name]} breaks {req}"


def test_dependency_layer_only_sees_the_constraints() -> None:
    steps = [
        line
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if re.match(r"^(COPY|RUN) ", line)
    ]
    first_install = next(i for i, s in enumerate(steps) if "pip install" in s)
    assert steps[:first_install] == ["COPY constraints.txt ./"]
    assert "-r constraints.txt" in steps[first_install]
    package_install = next(s for s in steps[first_install + 1 :] if "pip install" in s)
    assert "--no-deps" in package_install
