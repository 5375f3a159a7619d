"""Error types of the engine.

Every error the package raises on bad input or a failed read is a subclass of
:class:`EngramError`, so a server can catch one type.  The kinds also derive
from the closest built-in (``ValueError``, ``OSError``) so generic handlers keep
working.  Messages name the row, column, key, tensor or file offset involved.
"""

from __future__ import annotations


class EngramError(Exception):
    """Base class of every error raised by :mod:`engram`."""


class LayoutError(EngramError, ValueError):
    """An Engram layout is inconsistent (SPEC §2); the message names the field."""


class TokenError(EngramError, ValueError):
    """A token id, mask or token map entry is out of range or malformed."""


class HistoryError(EngramError, ValueError):
    """A hash history holds ids that cannot come from the layout in use."""


class FormatError(EngramError, ValueError):
    """A model file breaks the GGUF layout of SPEC §6; names the key or tensor."""


class DecodeError(EngramError, ValueError):
    """A row holds a NaN code, a NaN scale or decodes to a non-finite value (SPEC §5)."""

    def __init__(self, message: str, row: int = -1, column: int = -1):
        super().__init__(message)
        self.row = row
        self.column = column


class RowRangeError(EngramError, IndexError):
    """A row id lies outside its table; raised before any I/O."""


class TableIOError(EngramError, OSError):
    """A read of a table failed (short read, EIO, missing file); names row and offset."""

    def __init__(self, message: str, row: int = -1, offset: int = -1, errno_: int = 0):
        super().__init__(message)
        self.row = row
        self.offset = offset
        self.errno_ = errno_


class ArgumentError(EngramError, ValueError):
    """An argument has the wrong shape, dtype, layout in memory or value."""


class MaskError(ArgumentError, TokenError):
    """A mask breaks the one mask rule (bool, or integers that are all 0/1; one flag a token).

    An :class:`ArgumentError`; also a :class:`TokenError`, which ``Hasher.hash``
    raised for masks before the rule was shared by every entry point.
    """
