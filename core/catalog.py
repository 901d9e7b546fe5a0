"""The catalog (``Catalog``): models, servers and efficiency profiles by name, loaded from TOML
data files.

The package ships ``data/models/*.toml`` (one model per file), ``data/servers/*.toml`` (one
server per file) and ``data/profiles/*.toml`` (efficiency profiles); every figure in them
carries its source in a comment. Users add their own files in any directory passed as
``extra_dirs`` (or listed in ``TALARIA_CATALOG_PATH``, ``os.pathsep``-separated); a directory
may hold ``models/``, ``servers/`` and ``profiles/`` subfolders or the TOML files directly (a
file with a ``[server]`` table is a server, one with ``[model]`` a model, one with
``[profile]`` a profile). A user file with the same ``name`` as a shipped one replaces it.

A **variant** ``base@name`` (a fine-tune, say) is a model of its own (its own weights, its own
KV, its own cold start) with its base's spec: ``model("base@name")`` is the base's spec under
the variant's name, added to ``models`` the first time it is named (a workload names its
models before it reads ``models``), so that a market of fine-tunes needs no file of its own.
A file may still describe a variant by name, and then its spec is the file's.

Each table's class is its own module's: core/model_spec.py (``[model]``), core/server_spec.py
(``[server]``), core/efficiency_profile.py (``[profile]``); their error, core/catalog_error.py.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from talaria.core.catalog_error import CatalogError
from talaria.core.efficiency_profile import EfficiencyProfile, StepFit
from talaria.core.model_spec import ModelSpec, model_name_fault
from talaria.core.server_spec import ServerSpec


@dataclass
class Catalog:
    """The loaded models, servers and efficiency profiles, each by name."""

    models: dict[str, ModelSpec] = field(default_factory=dict)
    servers: dict[str, ServerSpec] = field(default_factory=dict)
    profiles: dict[str, EfficiencyProfile] = field(default_factory=dict)

    def model(self, name: str) -> ModelSpec:
        """The model named ``name``, or the variant ``base@name`` of a known base (module
        docstring); :class:`CatalogError` listing the known ones if none."""
        spec = self.find(name)
        if spec is not None:
            return spec
        known = ", ".join(sorted(m for m in self.models if "@" not in m))
        base, at, _ = name.partition("@")
        if at:
            raise CatalogError(
                f"unknown model {name!r}: a variant of {base!r}, which is not in the catalog; "
                f"known: {known}"
            )
        raise CatalogError(f"unknown model {name!r}; known: {known}")

    def find(self, name: str) -> ModelSpec | None:
        """The model named ``name`` (a variant of a known base included), or None."""
        spec = self.models.get(name)
        base, at, _ = name.partition("@")
        if spec is None and at and base in self.models:
            spec = self.models[name] = replace(self.models[base], name=name)
        return spec

    def server(self, name: str) -> ServerSpec:
        """The server named ``name``; :class:`CatalogError` listing the known ones if none."""
        try:
            return self.servers[name]
        except KeyError as exc:
            known = ", ".join(sorted(self.servers))
            raise CatalogError(f"unknown server {name!r}; known: {known}") from exc

    def profile(self, name: str) -> EfficiencyProfile:
        """The efficiency profile named ``name``; :class:`CatalogError` if none."""
        try:
            return self.profiles[name]
        except KeyError as exc:
            known = ", ".join(sorted(self.profiles))
            raise CatalogError(f"unknown efficiency profile {name!r}; known: {known}") from exc


def _number_fault(kind: object, value: Any) -> str | None:
    """Why ``value`` cannot be a catalog field of annotation ``kind`` (``"float"``, ``"int"``;
    anything else: only its numbers are checked): a quoted number, a bool, a fraction for an
    integer, or NaN / ±infinity (TOML's ``nan`` and ``inf``), or None."""
    if kind in ("float", "int"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, not {value!r}"
        if kind == "int" and not isinstance(value, int):
            return f"must be an integer, not {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be finite, not {value!r}"
    if isinstance(value, dict | list | tuple):
        items = value.values() if isinstance(value, dict) else value
        return next((f for v in items if (f := _number_fault(None, v)) is not None), None)
    return None


def _build(cls: type[Any], table: dict[str, Any], source: str) -> Any:
    """``cls`` of a catalog ``table``; each of its numbers typed as ``cls`` declares the field
    and finite (else the cost model's estimates, and the node's status, carry NaN)."""
    for spec in fields(cls):
        fault = _number_fault(spec.type, table.get(spec.name, 0))
        if fault is not None:
            raise CatalogError(f"{source}: {spec.name} {fault}")
    try:
        return cls(**table)
    except (TypeError, ValueError) as exc:
        raise CatalogError(f"{source}: {exc}") from exc


def _load_file(path: Path, catalog: Catalog) -> None:
    with path.open("rb") as fh:
        try:
            doc = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise CatalogError(f"{path}: {exc}") from exc
    if "model" in doc:
        model: ModelSpec = _build(ModelSpec, doc["model"], str(path))
        fault = model_name_fault(model.name) if isinstance(model.name, str) else "needs a name"
        if fault is not None:
            raise CatalogError(f"{path}: {fault}")
        catalog.models[model.name] = model
    if "server" in doc:
        server: ServerSpec = _build(ServerSpec, doc["server"], str(path))
        catalog.servers[server.name] = server
    if "profile" in doc:
        table = dict(doc["profile"])
        fits = table.pop("fitted", {})
        if not isinstance(fits, dict):
            raise CatalogError(f"{path}: [profile.fitted] must be a table of models")
        table["fitted"] = {
            model: _build(StepFit, fit, f"{path}: [profile.fitted.{model}]")
            for model, fit in fits.items()
        }
        profile: EfficiencyProfile = _build(EfficiencyProfile, table, str(path))
        catalog.profiles[profile.name] = profile
    if not {"model", "server", "profile"} & doc.keys():
        raise CatalogError(f"{path}: expected a [model], [server] or [profile] table")


def _toml_files(directory: Path) -> Iterable[Path]:
    for sub in (directory, directory / "models", directory / "servers", directory / "profiles"):
        if sub.is_dir():
            yield from sorted(sub.glob("*.toml"))


def load_catalog(extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> Catalog:
    """Shipped data, then ``TALARIA_CATALOG_PATH`` entries, then ``extra_dirs`` (later wins)."""
    catalog = Catalog(profiles={"default": EfficiencyProfile()})
    shipped = resources.files("talaria.core") / "data"
    with resources.as_file(shipped) as data_dir:
        for path in _toml_files(Path(data_dir)):
            _load_file(path, catalog)
    env_dirs = [d for d in os.environ.get("TALARIA_CATALOG_PATH", "").split(os.pathsep) if d]
    for directory in [*env_dirs, *extra_dirs]:
        path = Path(directory)
        if path.is_file():
            _load_file(path, catalog)
        elif path.is_dir():
            for file in _toml_files(path):
                _load_file(file, catalog)
        else:
            raise CatalogError(f"catalog path {path} does not exist")
    return catalog
