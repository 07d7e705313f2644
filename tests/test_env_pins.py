"""environment.yml (conda) and pyproject.toml pin the same versions, and the venv has them."""

from __future__ import annotations

import importlib.metadata as md
import tomllib

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from conftest import REPO


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _pyproject_reqs() -> list[Requirement]:
    proj = _pyproject()["project"]
    reqs = [Requirement(r) for r in proj["dependencies"]]
    for group in proj["optional-dependencies"].values():
        reqs += [Requirement(r) for r in group]
    return reqs


def _pins(reqs) -> dict[str, str]:
    """name -> version for every exact (==) pin; a name pinned twice must agree."""
    pins: dict[str, str] = {}
    for r in reqs:
        exact = [s.version for s in r.specifier if s.operator == "=="]
        if exact:
            name = canonicalize_name(r.name)
            assert pins.setdefault(name, exact[0]) == exact[0], f"{name} pinned to two versions"
    return pins


def _env() -> dict:
    return yaml.safe_load((REPO / "environment.yml").read_text())


def _env_pip() -> list[str]:
    [pip] = [d["pip"] for d in _env()["dependencies"] if isinstance(d, dict)]
    return pip


def test_every_optional_dependency_is_pinned_exactly():
    for extra, group in _pyproject()["project"]["optional-dependencies"].items():
        for r in map(Requirement, group):
            assert [s.operator for s in r.specifier] == ["=="], f"[{extra}] {r} is not pinned with =="


def test_environment_yml_pins_equal_pyproject_pins():
    env_reqs = [Requirement(line) for line in _env_pip() if not line.startswith("-")]
    assert _pins(env_reqs) == _pins(_pyproject_reqs())
    unpinned = [str(r) for r in env_reqs if not any(s.operator == "==" for s in r.specifier)]
    assert not unpinned, f"environment.yml pip entries without an exact pin: {unpinned}"


def test_environment_yml_installs_this_project_with_every_extra():
    extras = set(_pyproject()["project"]["optional-dependencies"])
    editable = [line for line in _env_pip() if line.startswith("-e")]
    assert len(editable) == 1
    assert Requirement("swa-repro" + editable[0].split(".", 1)[1].strip()).extras == extras


def test_environment_yml_conda_part():
    env = _env()
    assert env["channels"] == ["conda-forge", "nodefaults"]
    conda = {s.split("=")[0].strip(): s for s in env["dependencies"] if isinstance(s, str)}
    assert set(conda) == {"python", "pip"}
    py = conda["python"].split("=", 1)[1].lstrip("=")
    requires = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert requires.contains(py + ".0" if py.count(".") == 1 else py), (py, str(requires))


def test_this_environment_has_the_pinned_versions():
    """The venv `make test` built is what the pins say (torch may carry a local tag like +cpu)."""
    wrong = {}
    for name, version in _pins(_pyproject_reqs()).items():
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = None
        if have is None or not SpecifierSet(f"=={version}").contains(have, prereleases=True):
            wrong[name] = (version, have)
    assert not wrong, f"pinned vs installed: {wrong}"
