"""stackpin compatibility shims: small bridges over named upstream defects, declared per cell.

The cell's ``[compat.<id>]`` tables (pinning/*.toml) name, for each shim, the upstream
defect, the distribution and exact version it was written for, and the module whose import
applies it; /opt/stackpin/compat/shims.json carries them into the image. stackpin-compat.pth
runs this file at the start of every interpreter of the image (Studio's training worker
too, a fresh process): once a named module has been imported, ``apply(module)`` of
/opt/stackpin/compat/<id>.py patches it. Nothing is imported early, nothing is applied to
a module that never loads.

STACKPIN_COMPAT_OFF=<id>[,<id>...] (or "all") leaves shims out: what shows that each one is
still needed (the defect it names comes back). Standard library only.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import types
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))  # /opt/stackpin/compat in the image
STATE = types.ModuleType("stackpin_compat")  # what verify L5 reads: shims and applied ids
STATE.shims = {}
STATE.applied = []


class _ApplyAfter(importlib.abc.Loader):
    """Runs the real loader, then the shims waiting for this module."""

    def __init__(self, inner: Any, ids: list[str]) -> None:
        self.inner = inner
        self.ids = ids

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        for shim_id in self.ids:
            _shim(shim_id).apply(module)
            STATE.applied.append(shim_id)

    def __getattr__(self, name: str) -> Any:  # resources, get_source, ...: the real loader's
        return getattr(self.inner, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the modules that shims wait for."""

    def __init__(self, pending: dict[str, list[str]]) -> None:
        self.pending = pending

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        # Taken off before the search: a finder further on may look the name up again
        # (importlib.util.find_spec), which must not come back here.
        ids = self.pending.pop(name, None)
        if ids is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            self.pending[name] = ids  # not importable now; perhaps later on another path
            return None
        if spec.loader is None:
            self.pending[name] = ids
            return spec
        spec.loader = _ApplyAfter(spec.loader, ids)
        return spec


def _shim(shim_id: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"stackpin_compat_{shim_id.replace('-', '_')}", os.path.join(HERE, f"{shim_id}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install() -> None:
    with open(os.path.join(HERE, "shims.json"), encoding="utf-8") as handle:
        STATE.shims = json.load(handle)
    off = {word.strip() for word in os.environ.get("STACKPIN_COMPAT_OFF", "").split(",")}
    pending: dict[str, list[str]] = {}
    for shim_id, shim in sorted(STATE.shims.items()):
        if shim_id not in off and "all" not in off:
            pending.setdefault(shim["module"], []).append(shim_id)
    sys.modules["stackpin_compat"] = STATE
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


install()
