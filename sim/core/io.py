"""Documents in and out: JSON and JSONL reading, one atomic JSON writer, file hashes, timestamps, packaged data.

Every JSON document the simulator writes (``microbench.json``, ``runs.json``,
``calibration.json``, ``crosscheck.json``, ``demo.json``, saved devices, sweep
metadata) goes through :func:`write_json`, and every one it reads through
:func:`load_json` or :func:`read_jsonl`, so a reader meets one set of errors:
:class:`engram.FormatError` naming the file (and the line of a JSONL file).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import errno
import hashlib
import json
import os
import stat
from importlib import resources
from pathlib import Path
from typing import Iterator, List, Optional, Tuple, Union

from engram.cli import json_default
from engram.errors import EngramError, FormatError

__all__ = ["PACKAGED_DATA", "SHARED_DATA_ENV", "OutputError", "atomic_output", "check_output_folder", "load_json",
           "now_iso", "output_error", "packaged_data_dir", "packaged_data_path", "read_jsonl", "read_text",
           "sha256_file", "shared_data_dir", "write_json"]


class OutputError(EngramError, OSError):
    """A result file or folder could not be written (no permission, disk full, a file where a folder must be).

    The message names the path and the system's reason; ``errno`` and ``filename`` are those of the
    :class:`OSError` behind it.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def output_error(path: Union[str, os.PathLike], exc: OSError, what: str = "write") -> OutputError:
    """The :class:`OutputError` of an ``OSError`` met while writing ``path`` (``what``: the action, in words).

    The path named is the one the system reported when it names one (a parent folder that could not be made).
    """
    # the path the system named when it is another one (a parent folder that could not be made), never the
    # temporary file an atomic write goes through
    named = getattr(exc, "filename", None)
    where = named if named and not str(named).endswith(".tmp") else path
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        reason = "a file stands where a folder is needed"
    else:
        reason = exc.strerror or exc.__class__.__name__
    err = OutputError(f"{where}: cannot {what} ({reason})")
    err.errno, err.strerror, err.filename = exc.errno, exc.strerror, str(where)
    return err

#: The folder of package data in ``sim`` (``sim/data/``, declared in setup.cfg): the texts of the ``shared:``
#: trace sources and the device files of the presets, with their sources, licences and SHA-256 in its README.md.
PACKAGED_DATA = "data"

#: The environment variable naming a folder ``shared:NAME`` reads instead of the packaged texts.
SHARED_DATA_ENV = "ENGRAM_SHARED_DATA"

_extracted = contextlib.ExitStack()
atexit.register(_extracted.close)


def packaged_data_path(name: str = "") -> Path:
    """The path of ``name`` (``"promessi_sposi.txt"``, ``"devices/vm-virtio-16core-4k.jsonl"``; ``""``: the
    folder) in the package data ``sim/data/``, found by :func:`importlib.resources.files`.

    An installed package (a wheel, an editable install, a checkout) is a folder and the path is that file's;
    a package imported from a zip archive has the file extracted for the life of the process
    (:func:`importlib.resources.as_file`).  The path may name a file that is not there: callers check.
    """
    res = resources.files("sim").joinpath(PACKAGED_DATA, *[p for p in name.split("/") if p])
    if isinstance(res, Path):
        return res
    return _extracted.enter_context(resources.as_file(res))


def packaged_data_dir() -> Path:
    """The folder of the package data (``sim/data/``, :func:`packaged_data_path`)."""
    return packaged_data_path()


def shared_data_dir() -> Path:
    """The folder ``shared:NAME`` trace sources are read from: ``$ENGRAM_SHARED_DATA`` when set (a folder of
    the user's own texts), else the package's own copies (:func:`packaged_data_dir`).  Never a folder beside
    the checkout."""
    env = os.environ.get(SHARED_DATA_ENV)
    return Path(env) if env else packaged_data_dir()


def read_text(path: Union[str, os.PathLike], what: str = "") -> str:
    """The text of a UTF-8 file: every text file the simulator reads (JSON, JSONL, TOML, CSV) comes through here.

    ``what`` names the document in errors (``"study"``, ``"table"``, ...).

    Raises
    ------
    FormatError
        The file cannot be read (the system's reason), or is not UTF-8 (names the byte offset and the byte).
    """
    label = f" {what}" if what else ""
    try:
        mode = os.stat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a device (/dev/zero), a pipe: it may have no end
            raise FormatError(f"{path}: cannot read{label} (not a regular file)")
        data = Path(path).read_bytes()
    except OSError as exc:
        raise FormatError(f"{path}: cannot read{label} ({exc.strerror or exc.__class__.__name__})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{path}: the {what or 'file'} is not UTF-8 text: byte {exc.start} is "
                          f"0x{data[exc.start]:02x} ({exc.reason})") from None


def load_json(path: Union[str, os.PathLike], kind: Optional[str] = None) -> dict:
    """Read a JSON document; with ``kind``, insist on its ``"kind"`` field.

    Raises
    ------
    FormatError
        Unreadable, not JSON, not an object, or of another kind (names the file).
    """
    path = Path(path)
    d = _json_object(read_text(path), f"{path}", str)
    if kind is not None and d.get("kind") != kind:
        raise FormatError(f"{path}: expected a {kind!r} document, got kind {d.get('kind')!r}")
    return d


def _json_object(text: str, where: str, why) -> dict:
    """The JSON object ``text`` holds; FormatError naming ``where`` (and ``why(exc)`` of a parse error) else."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{where}: not JSON ({why(exc)})") from None
    except RecursionError:
        raise FormatError(f"{where}: JSON nested too deep to read") from None
    if not isinstance(d, dict):
        raise FormatError(f"{where}: expected a JSON object")
    return d


def read_jsonl(path: Union[str, os.PathLike], what: str) -> List[Tuple[int, dict]]:
    """``(line number, object)`` of every non-empty line of a JSONL file (``what`` names it in errors).

    Raises
    ------
    FormatError
        The file cannot be read or is not UTF-8 (:func:`read_text`), or a line is not a JSON object (names the
        line).
    """
    lines = read_text(path, what).splitlines()
    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        out.append((lineno, _json_object(line, f"{path}: line {lineno}", lambda exc: exc.msg)))
    return out


def check_output_folder(path: Union[str, os.PathLike]) -> Path:
    """``path`` (a file to write) when its folder exists; nothing is created.

    As for ``cp`` and ``mv`` (and :func:`engram.gguf.write.check_outputs`), a missing folder is most often a
    mistyped path: it is refused, not made.  Folders a command makes itself (a report folder, a measurement
    folder) are made by that command, below a folder that exists.

    Raises
    ------
    OutputError
        The folder does not exist (``errno`` ENOENT) or a part of it is a file (ENOTDIR); names both.
    """
    path = Path(path)
    folder = path.parent
    if folder.is_dir():
        return path
    err = OutputError(f"{path}: cannot write: the folder {folder} does not exist; make it first"
                      if not folder.exists() and not any(p.is_file() for p in folder.parents)
                      else f"{path}: cannot write: a part of {folder} is a file, where a folder is needed")
    err.errno = errno.ENOENT if "does not exist" in str(err) else errno.ENOTDIR
    err.filename = str(folder)
    raise err


def write_json(path: Union[str, os.PathLike], obj) -> Path:
    """Write ``obj`` as indented JSON (NumPy scalars and arrays allowed), atomically; return the path.

    The document goes to ``PATH.tmp`` first and replaces ``PATH`` in one
    rename, so a reader (or an interrupted run) never sees half a file.
    Its folder must exist (:func:`check_output_folder`).

    Raises
    ------
    OutputError
        The file or its folder cannot be written (names the path and the reason).
    """
    path = check_output_folder(path)
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=1, default=json_default), encoding="utf-8")
    return path


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """The way every output file is written: the block writes ``PATH.tmp`` (yielded), which then replaces
    ``path`` in one rename, so a reader never sees a partial file.

    Raises
    ------
    OutputError
        An ``OSError`` of the block or of the rename (names ``path`` and the reason); ``PATH.tmp`` is removed,
        as it is when the block raises anything else (which goes on unchanged).
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise output_error(path, exc) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def sha256_file(path: Union[str, os.PathLike]) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def now_iso() -> str:
    """The local time with its UTC offset, ISO 8601 to the second: the date stamp of every document."""
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")
