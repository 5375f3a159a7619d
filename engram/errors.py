"""Error types of the engine.

Every error the package raises on bad input or a failed read is a subclass of
:class:`EngramError`, so a server can catch one type.  The kinds also derive
from the closest built-in (``ValueError``, ``OSError``) so generic handlers keep
working.  Messages name the row, column, key, tensor or file offset involved;
a :class:`VocabularyError` names the tokenizer, the model file and the first
token id that differs; an :class:`OutputError` the file that could not be
written and why; a :class:`DeviceError` the accelerator device, or the extra
(``engram[gpu]``) to install.
"""

from __future__ import annotations

from typing import Optional


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


class VocabularyError(TokenError):
    """The tokenizer that encodes text is not the one a model's token map was made with (SPEC §3).

    Its token ids would hash to other rows, silently.  The message names both
    sources and the first token id (or merge) that differs, with both strings.

    Attributes
    ----------
    tokenizer_source, file_source : str
        The tokenizer (``"tokenizer /path/tokenizer.json"``) and the file's key.
    token_id : int
        The first token id that differs (-1 for a merge or when not known).
    tokenizer_token, file_token : str or None
        Its string in each (for a merge: the merges that differ).
    """

    def __init__(self, message: str, tokenizer_source: str = "", file_source: str = "", token_id: int = -1,
                 tokenizer_token: Optional[str] = None, file_token: Optional[str] = None):
        super().__init__(message)
        self.tokenizer_source = tokenizer_source
        self.file_source = file_source
        self.token_id = token_id
        self.tokenizer_token = tokenizer_token
        self.file_token = file_token


class OutputError(EngramError, OSError):
    """A file or folder could not be written: a read-only file system, a full disk, no permission, a file
    where a folder must be.

    The message names the path asked for (never a temporary one) and the system's reason; ``errno``,
    ``strerror`` and ``filename`` are those of the :class:`OSError` behind it.  Whatever was being written
    is removed: nothing half-written remains under the name asked for.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class CacheError(EngramError):
    """A row cache (:class:`engram.RowCache`) cannot be built or used as asked; the kinds below say why."""


class CacheSizeError(CacheError, ArgumentError):
    """A row cache's budget holds no row (below 264 bytes), is not a size, or exceeds the machine's memory."""


class CachePolicyError(CacheError, ArgumentError):
    """A row cache policy (or prefill rule) that does not exist; the message lists those that do."""


class CacheLayoutError(CacheError, LayoutError):
    """A row cache already serving one model was given to a model of another layout or other tables: its
    keys ``(layer, row)`` would name other rows."""


class CacheCopyError(CacheError, TypeError):
    """A row cache was copied (``copy.copy``, ``copy.deepcopy``) or pickled: it holds native state, a lock and
    open descriptors that a copy would share or lose, so neither is made; make a new
    :class:`engram.RowCache` (a child process after ``fork()`` gets its own copy)."""


class DeviceError(EngramError, RuntimeError):
    """The accelerator path (:mod:`engram.gpu`) cannot run: PyTorch is not installed (the message
    names the extra ``engram[gpu]``), the device does not exist, or it ran out of memory.

    Attributes
    ----------
    device : str
        The device asked for (``"cuda:1"``), or ``""`` when none was reached.
    """

    def __init__(self, message: str, device: str = ""):
        super().__init__(message)
        self.device = device
