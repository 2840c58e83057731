"""The module paths of releases before the package's folders still import, each with one ``FutureWarning``
naming its new path: ``import capcal_integrations.adapter`` is ``capcal_integrations.integrations.adapter``.

A finder at the end of ``sys.meta_path`` answers only the old names below (nothing on disk has them), with
the new module itself, so both names are one module. Three old modules are folders now
(``content_check``, ``calibration``, ``prompts``): their ``__init__`` forwards the old module's names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install", "forwarded"]

_PACKAGE = __name__.rpartition(".")[0]

#: Old module (inside the package) -> its new path.
MOVED = {
    "adapter": "integrations.adapter", "answers": "endpoints.answers", "attempts": "content_check.attempts",
    "batch": "commands.batch", "batchfile": "commands.batchfile", "caches": "endpoints.caches",
    "calls": "endpoints.calls", "cli": "commands.cli", "client": "transport.client", "command_flags": "commands.flags",
    "content_decision": "content_check.decision", "contrast": "content_check.contrast",
    "deadline": "ranking.deadline", "decide_command": "commands.decide", "decisions_command": "commands.decisions",
    "decoding": "ranking.decoding", "demo_command": "commands.demo", "depth": "ranking.depth",
    "drivers": "transport.drivers", "files": "prompts.files", "fitting": "ranking.fitting",
    "judged": "content_check.judged", "labels": "reading.labels", "orders": "ranking.orders",
    "parsers": "option_values", "probe": "endpoints.probe", "progress": "ranking.progress",
    "query_contrast": "content_check.query_contrast", "rerank_command": "commands.rerank",
    "routing": "endpoints.routing", "rules": "content_check.rules", "saved_decisions": "content_check.saved_decisions",
    "saved_readings": "content_check.saved_readings", "slots": "endpoints.slots", "strategies": "ranking.strategies",
    "strength": "calibration.strength", "textlabels": "reading.textlabels", "transfer": "transport.transfer",
    "typed_json": "content_check.typed_json", "untrusted": "prompts.untrusted",
    "calibration.tuning": "tuning",  # back at the root, beside the reranker it runs (the folders are the layers)
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path goes in a later release", FutureWarning, stacklevel=3)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_PACKAGE + ".") or fullname[len(_PACKAGE) + 1:] not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = f"{_PACKAGE}.{MOVED[spec.name[len(_PACKAGE) + 1:]]}"
        _warn(spec.name, new)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module, already run


def install() -> None:
    """Put the finder at the end of ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())


def forwarded(package: str, old_module: str, new_module: str, name: str) -> object:
    """A name of an old module that is a folder now (``capcal_integrations.content_check.ContentCheck``), from
    its new module, with the warning; an ``AttributeError`` for a name it never had."""
    if name.startswith("__") or importlib.util.find_spec(f"{package}.{name}") is not None:  # a submodule: import it
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module = importlib.import_module(new_module)
    if not hasattr(module, name):
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    _warn(f"{old_module}.{name}", f"{new_module}.{name}")
    return getattr(module, name)
