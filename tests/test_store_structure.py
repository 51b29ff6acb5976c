"""How the store is built, checked from its source: the backends share code only through
backend-neutral classes and the dialect, never by one subclassing the other or by
overriding the shared code; neither imports the other; the package's public surface is
what `__all__` says.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import speakermem.memory.store

STORE = Path(speakermem.memory.store.__file__).parent
BACKENDS = ("speakermem.memory.store.sqlite", "speakermem.memory.store.pg")
DISPATCH = {
    # the modules that pick a backend for their caller
    "speakermem.memory.store",
    "speakermem.memory.store.factory",
    "speakermem.memory.store.backup",
    "speakermem.memory.store.diagnostics",
    "speakermem.memory.store.migrate",
    # the SQLite driver's old import path, kept for callers
    "speakermem.memory.store.driver",
}


def store_modules() -> list[str]:
    """Every module of the store, packages' __init__ included."""
    found = pkgutil.walk_packages([str(STORE)], prefix="speakermem.memory.store.")
    return ["speakermem.memory.store", *sorted(info.name for info in found)]


def imported(module: str) -> set[str]:
    """The memory.store modules `module` imports (at any depth of its code)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("speakermem.memory.store")}


def backend_of(module: str) -> str | None:
    return next((b for b in BACKENDS if module == b or module.startswith(b + ".")), None)


@pytest.mark.parametrize("module", store_modules())
def test_a_backend_imports_neither_the_other_nor_is_imported_by_shared_code(module: str) -> None:
    own = backend_of(module)
    for name in imported(module):
        other = backend_of(name)
        if other is None or other == own:
            continue
        assert own is None, f"{module} (a {own} module) imports {name}"
        assert module in DISPATCH, f"shared module {module} imports the backend module {name}"


def backend_classes() -> list[type]:
    classes: list[type] = []
    for name in store_modules():
        if backend_of(name) is None:
            continue
        try:
            module: ModuleType = importlib.import_module(name)
        except ImportError as exc:  # psycopg missing: the PostgreSQL backend cannot load
            pytest.skip(f"{name}: {exc}")
        classes.extend(
            c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == name
        )
    return classes


def test_no_class_of_one_backend_derives_from_the_others() -> None:
    for cls in backend_classes():
        own = backend_of(cls.__module__)
        for base in cls.__mro__[1:]:
            other = backend_of(base.__module__)
            assert other in (None, own), f"{cls.__module__}.{cls.__qualname__} derives from {base}"


def test_a_backend_adds_to_the_shared_classes_but_never_overrides_them() -> None:
    """A backend's repository implements the shared class's abstract methods and adds its
    own; a change to shared code is never silently replaced in one backend."""
    for cls in backend_classes():
        for base in cls.__mro__[1:]:
            if not base.__module__.startswith("speakermem.memory.store") or backend_of(
                base.__module__
            ):
                continue
            abstract = getattr(base, "__abstractmethods__", frozenset())
            for name, value in vars(cls).items():
                if name.startswith("__") or name in abstract or name not in vars(base):
                    continue
                if inspect.isfunction(value) or isinstance(value, property):
                    pytest.fail(f"{cls.__qualname__}.{name} overrides {base.__qualname__}.{name}")


def test_the_public_surface_is_what_all_says() -> None:
    public = {
        name
        for name, value in vars(speakermem.memory.store).items()
        if not name.startswith("_")
        and not inspect.ismodule(value)
        and name != "annotations"
        and getattr(value, "__module__", "speakermem.memory.store").startswith(
            "speakermem.memory.store"
        )
    }
    assert sorted(speakermem.memory.store.__all__) == sorted(public)
    for name in speakermem.memory.store.__all__:
        assert getattr(speakermem.memory.store, name) is not None


@pytest.mark.parametrize("module", store_modules())
def test_no_store_file_grows_past_600_lines(module: str) -> None:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    assert len(Path(spec.origin).read_text().splitlines()) <= 600, module
