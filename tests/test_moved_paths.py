"""Issue 37: the modules moved into folders; their old paths still import (one FutureWarning naming the new
path) and are the new modules themselves, and the three old modules that are folders now forward their names."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import capcal_integrations
from capcal_integrations._moved import MOVED


def test_every_old_module_path_imports_the_new_module_with_one_warning():
    """In a fresh process (no old path imported yet): each old path warns once, naming the new one, and is the
    new module object."""
    code = """
import importlib, json, warnings
from capcal_integrations._moved import MOVED
out = {}
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module("capcal_integrations." + old)
        again = importlib.import_module("capcal_integrations." + old)
    said = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    out[old] = [said, module is again is importlib.import_module("capcal_integrations." + new)]
print(json.dumps(out))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert sorted(out) == sorted(MOVED)
    for old, (said, same) in out.items():
        assert said == [f"capcal_integrations.{old} moved to capcal_integrations.{MOVED[old]}; the old path goes in a "
                        "later release"], (old, said)
        assert same, old


def test_the_old_adapter_import_of_a_third_party_adapter_still_works():
    with pytest.warns(FutureWarning, match="integrations.adapter"):
        code = compile("from capcal_integrations.adapter import RerankerSettings", "<user>", "exec")
        sys.modules.pop("capcal_integrations.adapter", None)
        scope: dict = {}
        exec(code, scope)
    from capcal_integrations.integrations.adapter import RerankerSettings
    assert scope["RerankerSettings"] is RerankerSettings


@pytest.mark.parametrize("package,module,name", [
    ("content_check", "check", "ContentCheck"), ("calibration", "formulas", "calibrated"),
    ("prompts", "render", "render_prompt")])
def test_an_old_module_that_is_a_folder_now_forwards_its_names(package, module, name):
    folder = importlib.import_module(f"capcal_integrations.{package}")
    with pytest.warns(FutureWarning, match=f"{package}.{module}.{name}"):
        value = getattr(folder, name)
    assert value is getattr(importlib.import_module(f"capcal_integrations.{package}.{module}"), name)
    with pytest.raises(AttributeError):
        folder.no_such_name  # noqa: B018
    from capcal_integrations.content_check import rules  # a submodule is imported, never forwarded

    assert rules.__name__ == "capcal_integrations.content_check.rules"


def test_new_names_and_other_paths_are_left_alone():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("capcal_integrations.no_such_module")
    assert capcal_integrations.CapCalReranker.__module__ == "capcal_integrations.reranker"
