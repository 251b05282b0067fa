"""Registries: the named things users add to the workbench, each declared once.

What an ablation changes -- an activation, a normalization, a scale rule, an
element format, a GEMM operand -- is an *entry*: a small frozen dataclass
with a ``name``, a one-line ``doc`` and the properties the code needs (a
function, a width rule, the formats it is defined for). Each kind has one
:class:`Registry`, and everything that names entries reads it: Config's
validation and choices, the command line's options and ``mx-proxy list``,
the docs' tables and the explorer's dropdowns. Nothing else lists an entry's
name or compares it as a string (a spec holds the entry itself, e.g.
``MXSpec.scale_rule``), so adding an entry is writing it down once. Choices
that are not registries are plain tuples whose code does compare names:
the architectures (``nn/architectures.py``: ``arch == "ngpt"``) and the init
schemes (``nn/inits.py``: ``init == "pytorch"``).

The entries of the activation, normalization and scale-rule registries each
live in a module of their own package (``mx_proxy/nn/activations/``,
``mx_proxy/nn/norms/``, ``mx_proxy/numerics/scale_rules/``): the package
imports every module in it when it is imported (:func:`load_entries`), so a
new file is a new entry, with no list to edit. A registry also takes entries
at run time (:meth:`Registry.register`; :meth:`Registry.added` for a
throw-away one).
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry", "Subset", "load_entries"]

E = TypeVar("E")


class Registry(Generic[E]):
    """Named entries of one kind (like a read-only mapping ``name -> entry``).

    Iterating gives the names, ordered by each entry's ``order`` (default
    100) and then by registration, so ``", ".join(registry)`` lists the valid
    choices and ``name in registry`` checks one. Lookups read the live
    registry: an entry registered later is valid everywhere at once.
    """

    def __init__(self, kind: str, what: str, entry_type: type | None = None):
        """``kind``: the entry's name in messages (``"activation"``); ``what``: a
        one-line description of the registry (``mx-proxy list``); ``entry_type``:
        the class every entry is an instance of (``None``: any)."""
        self.kind = kind
        self.what = what
        self.entry_type = entry_type
        self._entries: dict[str, E] = {}

    def register(self, entry: E) -> E:
        """Add ``entry`` (it needs a non-empty ``name`` and a ``doc``); returns it.

        Raises:
          ValueError: an entry that is not an ``entry_type``, or a name that is
            empty, not a string, or already taken.
        """
        if self.entry_type is not None and not isinstance(entry, self.entry_type):
            kind = self.entry_type.__name__
            raise ValueError(f"register takes {'an' if kind[0] in 'AEIOU' else 'a'} {kind}, got {type(entry).__name__}")
        name = getattr(entry, "name", None)
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(f"a {self.kind} needs a non-empty name without surrounding spaces, got {name!r}")
        if not isinstance(getattr(entry, "doc", None), str):
            raise ValueError(f"{self.kind} {name!r} needs a one-line doc string")
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Take an entry out again (a test's throw-away entry)."""
        self.get(name)
        del self._entries[name]

    @contextlib.contextmanager
    def added(self, entry: E):
        """``with registry.added(entry):`` -- the entry is valid inside the block only."""
        self.register(entry)
        try:
            yield entry
        finally:
            self._entries.pop(entry.name, None)

    def get(self, name) -> E:
        """The entry called ``name`` (an entry itself passes through).

        Raises:
          ValueError: an unknown name, naming it and the valid ones.
        """
        if isinstance(name, str) and name in self._entries:
            return self._entries[name]
        if any(name is e for e in self._entries.values()):
            return name
        raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(self)}")

    def names(self) -> tuple[str, ...]:
        """The valid names, in listing order."""
        return tuple(self)

    def entries(self) -> tuple[E, ...]:
        """The entries, in listing order."""
        return tuple(self._entries[n] for n in self)

    def keys(self) -> tuple[str, ...]:
        """The names, in listing order (as a mapping's ``keys``)."""
        return tuple(self)

    def values(self) -> tuple[E, ...]:
        """The entries, in listing order (as a mapping's ``values``)."""
        return self.entries()

    def items(self) -> tuple[tuple[str, E], ...]:
        """``(name, entry)`` pairs, in listing order (as a mapping's ``items``)."""
        return tuple((n, self._entries[n]) for n in self)

    def subset(self, keep, what: str) -> Subset[E]:
        """A live view of the entries for which ``keep(entry)`` is true
        (``what``: how messages name them, e.g. ``"MX element format"``)."""
        return Subset(self, keep, what)

    def rows(self, columns: Iterable[tuple[str, str]] = ()) -> list[list[str]]:
        """One row per entry: its name, the named attributes (``(header,
        attribute)`` pairs) as text, its doc line."""
        return [[e.name, *(_cell(getattr(e, a)) for _, a in columns), e.doc] for e in self.entries()]

    def table(self, columns: Iterable[tuple[str, str]] = ()) -> str:
        """:meth:`rows` as a Markdown table (the docs' tables, ``mx-proxy list KIND --markdown``)."""
        columns = tuple(columns)
        head = "| name | " + "".join(f"{h} | " for h, _ in columns) + "what |"
        rows = [head, "|" + "---|" * (len(columns) + 2)]
        rows += ["| `" + r[0] + "` | " + " | ".join(r[1:]) + " |" for r in self.rows(columns)]
        return "\n".join(rows)

    def __getitem__(self, name: str) -> E:
        if name not in self._entries:
            raise KeyError(name)
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        order = {n: i for i, n in enumerate(self._entries)}
        return iter(sorted(self._entries, key=lambda n: (getattr(self._entries[n], "order", 100), order[n])))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind}: {', '.join(self)})"

    # a registry is a live view, not a value: keep it out of hashes and equality of what holds it
    __hash__ = object.__hash__

    def __eq__(self, other) -> bool:
        return self is other


class Subset(Generic[E]):
    """The entries of a :class:`Registry` that pass a test, read live (an
    entry registered later is in it at once): a field's choices such as
    Config's MX element formats. Iterating gives the names in listing order."""

    def __init__(self, registry: Registry[E], keep, what: str):
        self.registry, self.keep, self.what = registry, keep, what

    def __iter__(self) -> Iterator[str]:
        return iter([n for n in self.registry if self.keep(self.registry[n])])

    def __contains__(self, name) -> bool:
        return name in self.registry and bool(self.keep(self.registry[name]))

    def __len__(self) -> int:
        return len(list(iter(self)))

    def names(self) -> tuple[str, ...]:
        """The valid names, in listing order."""
        return tuple(self)

    def get(self, name) -> E:
        """The entry called ``name``. Raises ValueError naming the valid ones."""
        if isinstance(name, str) and name in self:
            return self.registry[name]
        raise ValueError(f"unknown {self.what} {name!r}; valid: {', '.join(self)}")

    def __repr__(self) -> str:
        return f"Subset({self.what}: {', '.join(self)})"


def _cell(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "–"
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (tuple, list)):
        return ", ".join(map(str, v)) or "–"
    return str(v)


def load_entries(package: str, path: Iterable[str]) -> None:
    """Import every module of a registry package (``package`` its dotted name,
    ``path`` its ``__path__``), in name order: each module registers its
    entry when imported. Modules whose name starts with ``_`` are skipped."""
    for info in sorted(pkgutil.iter_modules(list(path)), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")
