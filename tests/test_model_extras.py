"""Issue 24 item 7: every embedded model's packages are an extra of this package, with the sha256 the library
checks named in the README; nothing installs weights at serve time."""

from __future__ import annotations

import inspect
import pathlib

import pytest

from capcal_integrations.server import models
from capcal_integrations.server.models import MODELS

ROOT = pathlib.Path(__file__).resolve().parent.parent
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_each_packaged_model_is_an_extra_holding_exactly_its_packages():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for spec in MODELS.values():
        if spec.extra is None:  # smollm2: --no-deps (its own dependencies are another library's)
            assert spec.no_deps
            continue
        assert set(spec.packages) <= set(extras[spec.extra]), spec.name
        assert any(r.startswith("xllamacpp==") for r in extras[spec.extra])  # the extra alone serves it


def test_no_pip_at_serve_time():
    source = inspect.getsource(models)
    assert "subprocess" not in source and '"pip"' not in source


def test_the_readme_names_the_packages_and_their_sha256():
    text = (ROOT / "README.md").read_text() + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    for spec in MODELS.values():
        assert spec.sha256 in text, spec.name
        assert spec.packages[0].split("==")[0] in text, spec.name
        if spec.extra:
            assert f"[{spec.extra}]" in text
