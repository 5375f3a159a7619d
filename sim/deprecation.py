"""Old import paths kept working: names that moved to another module, reached through a module ``__getattr__``.

A module whose names moved declares ``__getattr__ = moved(__name__, {old name: (object, new home)})``;
reading an old name returns the object and raises a :class:`DeprecationWarning` that names its new home.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Tuple

__all__ = ["moved"]


def moved(module: str, names: Mapping[str, Tuple[Any, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``names``: old name -> (the object, the module that now owns it)."""

    def __getattr__(name: str) -> Any:
        try:
            obj, home = names[name]
        except KeyError:
            raise AttributeError(f"module {module!r} has no attribute {name!r}") from None
        warnings.warn(f"{module}.{name} moved to {home}.{name}", DeprecationWarning, stacklevel=2)
        return obj

    return __getattr__
