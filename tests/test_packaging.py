"""Installed, the code lives under `loopaudit` only; every source package must be mapped there."""

from __future__ import annotations

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the package itself supports 3.10

from .conftest import REPO  # noqa: E402 (after the skip: the module needs tomllib)


def test_every_source_package_is_installed_under_the_loopaudit_namespace():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = config["package-dir"]
    folders = sorted(
        str(init.parent.relative_to(REPO)) for top in ("auditor", "rules") for init in (REPO / top).rglob("__init__.py")
    )
    assert sorted(mapping.values()) == folders, "add the new folder to [tool.setuptools] in pyproject.toml"
    assert sorted(mapping) == sorted(config["packages"])
    assert all(name == "loopaudit" or name.startswith("loopaudit.") for name in mapping)
