"""Writing model files: outputs that appear only complete, and ``engram repair``.

:func:`atomic_outputs` gives the writer temporary paths in a private folder
beside the outputs and renames them into place only when the writing finished
(the first path last, so a split set is complete once its first shard exists).
A writer killed mid-way (power loss, SIGKILL) leaves no file under a final name,
only the folder ``.NAME.partial-PID``; one that fails with an exception removes
it.  ``engram synth`` and :func:`repair_model` write through it.

:func:`repair_model` rewrites a model whose Engram keys are spelled the legacy
way (``deepseek4.engram.*``), leave derivable constants out, or state them
wrongly: it derives every derivable constant from the primary keys
(:mod:`.keys`), checks the result against the tensors (the table shapes must
agree with the sums of the primes, ``engram_kv`` with the columns, ...), and
writes a new file (or split set) with the current ``{arch}.engram.*`` keys,
every other key as it was, and the tensor data copied (holes stay holes).
Header and metadata are written by ``gguf.GGUFWriter``; the values of the
keys copied are read by the bounded header parser (:mod:`.header`), which
``gguf.GGUFReader`` would do by mapping the whole file and one view per string
of a vocabulary.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import struct
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from gguf import GGUFEndian, GGUFValueType, GGUFWriter
from tqdm import tqdm

from ..codec import ROW_VALUES
from ..errors import ArgumentError, EngramError, FormatError, OutputError, TableIOError
from .header import Header, PathLike, close_quietly, load_array, load_strings, pad
from .info import ModelInfo, model_info, read_headers, read_model
from .keys import ARCHITECTURES, EPS_KEY, engram_keys, family_keys
from .shards import shard_name
from .tensors import engram_layer_ids

__all__ = ["atomic_outputs", "repair_model", "engram_metadata", "ArrayWriter", "output_error", "check_room",
           "check_outputs", "size_text", "progress_bar", "bar_wanted", "BAR_MODES", "FREE_MARGIN", "WRITE_ERRNOS"]

#: Bytes copied per ``copy_file_range`` call (bounds a call's latency, not memory).
COPY_CHUNK = 64 << 20

Metadata = Dict[str, Tuple[Any, GGUFValueType, Optional[GGUFValueType]]]

#: Bytes a writer leaves free on the file system beyond what it writes (its own metadata, other writers).
FREE_MARGIN = 64 << 20
#: ``errno`` values of a failure to write the output rather than to read an input.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM,
                          errno.ENOTDIR, errno.EEXIST, errno.EISDIR})


def size_text(n: int) -> str:
    """``n`` bytes in words: ``"5.6 MiB"``, ``"1.2 GiB"``."""
    return f"{n / 2**30:.1f} GiB" if n >= 1 << 30 else f"{n / 2**20:.1f} MiB"


def output_error(path: PathLike, exc: OSError, what: str = "write") -> OutputError:
    """The :class:`~engram.errors.OutputError` of ``exc``, met while writing ``path`` (``what``: the action).

    Names ``path`` (the file asked for, never the temporary one a writer works
    on), and the folder the system named when it is another one (a parent that
    could not be made, a file standing where a folder is needed).
    """
    if isinstance(exc, OutputError):
        return exc
    named = getattr(exc, "filename", None)
    own = named is None or ".partial-" in str(named) or Path(named) == Path(path)
    if isinstance(exc, FileExistsError) and not own:
        reason = f"{named} is a file, where a folder is needed"
    elif isinstance(exc, NotADirectoryError) and not own:
        reason = f"a part of {named} is a file, where a folder is needed"
    else:
        reason = (exc.strerror or type(exc).__name__) if own else f"{named}: {exc.strerror or type(exc).__name__}"
    err = OutputError(f"{path}: cannot {what} ({reason})")
    err.errno, err.strerror, err.filename = exc.errno, exc.strerror, str(path)
    return err


#: What a path that is not a regular file is, by ``stat.S_IFMT`` of its mode.
_NODE_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


def _refuse(path: Path, reason: str, code: int) -> OutputError:
    err = OutputError(f"{path}: cannot write ({reason})")
    err.errno, err.strerror, err.filename = code, os.strerror(code), str(path)
    return err


def _check_target(path: Path) -> None:
    """``path`` is absent or a regular file (a symlink is followed): anything else is never replaced."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # absent, or a dangling symlink (the rename replaces the link)
        return
    except OSError as exc:
        raise output_error(path, exc) from None
    if not stat.S_ISREG(mode):
        kind = _NODE_KINDS.get(stat.S_IFMT(mode), f"a special file (mode {stat.S_IFMT(mode):o})")
        link = f"a symlink to {os.path.realpath(path)}, " if os.path.islink(path) else ""
        raise _refuse(path, f"it is {link}{kind}, not a regular file; only a regular file is replaced",
                      errno.EISDIR if stat.S_ISDIR(mode) else errno.EEXIST)


def check_outputs(paths: Sequence[PathLike], parents: bool = False) -> None:
    """The rule of every file the engine writes, checked before anything is written.

    Each path must be absent or a regular file (a symlink is followed): a
    directory, a device node (``/dev/full``), a FIFO or a socket is never
    replaced by the file written -- renaming over it would swap the node for a
    regular file.  Their folder must exist, as for ``cp`` and ``mv``: a missing
    folder is most often a mistyped path.  With ``parents`` it is made (with
    its missing parents, as ``mkdir -p``; the commands' ``--parents``).

    Raises
    ------
    OutputError
        Names the path and what it is (``"it is a character device, not a
        regular file"``), or the folder that is missing (``errno`` ENOENT) or
        is a file (``errno`` ENOTDIR); nothing is created then.
    """
    finals = [Path(p) for p in paths]
    for folder in dict.fromkeys(p.parent for p in finals):
        if parents:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise output_error(finals[0], exc) from None
            continue
        try:
            is_dir = stat.S_ISDIR(os.stat(folder).st_mode)
        except FileNotFoundError:
            raise _refuse(finals[0], f"the folder {folder} does not exist; make it first, or pass --parents "
                                     f"(in Python: parents=True, or engram.synth.Writing(parents=True))", errno.ENOENT) from None
        except NotADirectoryError:
            raise _refuse(finals[0], f"a part of {folder} is a file, where a folder is needed",
                          errno.ENOTDIR) from None
        except OSError as exc:
            raise output_error(finals[0], exc) from None
        if not is_dir:
            raise _refuse(finals[0], f"{folder} is a file, where a folder is needed", errno.ENOTDIR)
    for p in finals:
        _check_target(p)


def check_room(path: Path, need: int, what: str = "writing", hint: str = "") -> None:
    """Check the folder of ``path`` (which must exist: :func:`check_outputs`) has room for ``need`` bytes
    and :data:`FREE_MARGIN` more.

    Raises
    ------
    OutputError
        The folder cannot be read (names it and the reason), or the room is
        short (``errno`` ENOSPC; names the folder, the bytes needed and free).
    """
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError as exc:
        raise output_error(path, exc) from None
    if need + FREE_MARGIN > free:
        err = OutputError(f"{path}: cannot write ({what} it needs {size_text(need)} of disk and "
                          f"{size_text(FREE_MARGIN)} kept free; {path.parent} has {size_text(free)} free){hint}")
        err.errno, err.strerror, err.filename = errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)
        raise err


class ArrayWriter(GGUFWriter):
    """``gguf.GGUFWriter`` that packs a metadata array in one step instead of one ``struct.pack`` per element.

    The bytes are the ones ``GGUFWriter`` writes (little-endian: type, count,
    elements; a string as its uint64 length and UTF-8 bytes); a model's
    vocabulary (129,280 tokens, 127,741 merges) and token map then pack in
    about half the time ``GGUFWriter`` takes (``benchmarks/bench_vocabulary.py``).
    Nested arrays and big-endian files go the library's way.
    """

    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool,
                  sub_type: Optional[GGUFValueType] = None) -> bytes:
        if vtype != GGUFValueType.ARRAY or sub_type is None or self.endianess != GGUFEndian.LITTLE \
                or isinstance(val, (bytes, str)) or not len(val):
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        head = (struct.pack("<I", vtype) if add_vtype else b"") + struct.pack("<IQ", sub_type, len(val))
        fmt = self._simple_value_packing.get(sub_type)
        if fmt is not None:
            return head + np.asarray(val, dtype=np.dtype("<" + fmt)).tobytes()
        if sub_type == GGUFValueType.STRING:
            encoded = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in val]
            lengths = np.fromiter(map(len, encoded), dtype="<u8", count=len(encoded))
            parts = [b""] * (2 * len(encoded))
            parts[0::2] = [x.tobytes() for x in lengths]
            parts[1::2] = encoded
            return head + b"".join(parts)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


#: Seconds between two redraws of a progress bar written to something other than a terminal.
LOG_INTERVAL_S = 10.0
#: The ``progress`` values of the writers (:func:`repair_model`, :mod:`engram.synth`): the modes of the rest of the
#: project's progress output (``sim.core.progress``), besides ``True`` (``"auto"``) and ``False`` (``"off"``).
BAR_MODES = ("auto", "bar", "lines", "off")


def bar_wanted(progress: Union[bool, str, None], stream=None) -> bool:
    """Whether a writer's ``progress`` draws a bar on ``stream`` (default: standard error as it is now).

    The rule of the project's other progress output: ``True``, ``None`` or ``"auto"``: a bar only where ``stream``
    is a terminal (a tqdm bar redraws itself with carriage returns, which a log or a pipe keeps one per redraw);
    ``"bar"``: a bar wherever it goes; ``False``, ``"off"`` or ``"lines"``: none (these writers have no plain
    progress lines).

    Raises
    ------
    ArgumentError
        ``progress`` is none of these.
    """
    if isinstance(progress, np.bool_):
        progress = bool(progress)
    if progress is None or progress is True:
        progress = "auto"
    elif progress is False:
        progress = "off"
    if not isinstance(progress, str) or progress not in BAR_MODES:
        raise ArgumentError(f"progress must be a bool or one of {', '.join(BAR_MODES)}, got {progress!r:.60}")
    if progress == "auto":
        isatty = getattr(sys.stderr if stream is None else stream, "isatty", None)
        try:
            return bool(isatty is not None and isatty())
        except (ValueError, OSError):  # a closed stream is no terminal
            return False
    return progress == "bar"


@contextmanager
def progress_bar(show: Union[bool, str, None], total: int, desc: str) -> Iterator[Optional[tqdm]]:
    """A tqdm bar over ``total`` bytes on standard error where :func:`bar_wanted` says ``show`` asks for one,
    else None; a run that fails or is interrupted clears it, so its one-line error stands alone.  A bar asked
    for off a terminal (``"bar"``: a log, CI) is redrawn at most every :data:`LOG_INTERVAL_S` seconds, so a log
    holds a record every few seconds rather than one per update."""
    if not bar_wanted(show):
        yield None
        return
    tty = getattr(sys.stderr, "isatty", lambda: False)()
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr,
               mininterval=0.1 if tty else LOG_INTERVAL_S, maxinterval=max(10.0, LOG_INTERVAL_S))
    try:
        yield bar
    except BaseException:
        bar.leave = False
        raise
    finally:
        bar.close()


# ====================================================================== atomic outputs
def partial_dir(first: Path) -> Path:
    """The private folder a writer of ``first`` (and its sibling shards) works in."""
    return first.parent / f".{first.name}.partial-{os.getpid()}"


@contextmanager
def atomic_outputs(paths: Sequence[PathLike], parents: bool = False) -> Iterator[List[Path]]:
    """Temporary paths for ``paths`` (all in one folder), renamed into place when the block completes.

    Yields the temporary paths, in order, inside :func:`partial_dir` of the
    first path (same folder, so the renames stay on one file system).  On a
    normal exit every file is renamed over its final name (existing regular
    files are replaced), the first path last, and the folder removed.  On an
    exception the folder and everything in it are removed and the exception
    propagates; no final name is touched.

    The rule of :func:`check_outputs` holds on entry, before anything is
    made, and again before each rename (a node made meanwhile is not
    replaced either): a final name that is a directory, device, FIFO or socket
    is refused, and so is a missing folder unless ``parents``.

    An interrupt (Ctrl-C) is an exception like any other: nothing is left.

    Raises
    ------
    ArgumentError
        ``paths`` is empty or names files in different folders.
    OutputError
        A final name is not a regular file, the folder is missing (without
        ``parents``), cannot be made or written (read-only, full, a file where
        a folder is needed), or a rename failed: names the final path.
    """
    finals = [Path(p) for p in paths]
    if not finals or len({p.parent for p in finals}) != 1:
        raise ArgumentError(f"atomic_outputs: need one or more paths in one folder, got {[str(p) for p in finals]}")
    check_outputs(finals, parents)
    work = partial_dir(finals[0])
    try:
        shutil.rmtree(work, ignore_errors=True)  # a leftover of a killed writer that had our pid
        work.mkdir()
    except OSError as exc:
        raise output_error(finals[0], exc) from None
    temps = [work / p.name for p in finals]
    try:
        yield temps
        for tmp, final in list(zip(temps, finals))[1:] + [(temps[0], finals[0])]:
            _check_target(final)
            try:
                os.replace(tmp, final)
            except OSError as exc:
                raise output_error(final, exc) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ====================================================================== metadata
def _field_values(h: Header) -> Metadata:
    """Every metadata entry of header ``h`` as ``key -> (value, type, element type)``, in file order.

    Arrays the parser only located are read now (numeric ones whole, strings
    with :func:`.header.load_strings`).
    """
    out: Metadata = {}
    for name, kv in h.kv.items():
        if kv.type != GGUFValueType.ARRAY:
            out[name] = (kv.value, kv.type, None)
        elif kv.subtype == GGUFValueType.STRING:
            out[name] = (load_strings(kv), kv.type, kv.subtype)
        elif kv.subtype == GGUFValueType.ARRAY or kv.data_offset < 0:
            raise FormatError(f"{h.path}: {name}: nested arrays cannot be copied by repair")
        else:
            arr = kv.value if kv.value is not None else load_array(kv)
            out[name] = (arr.tolist(), kv.type, kv.subtype)
    return out


def engram_metadata(info: ModelInfo, *, optional_keys: bool = False, eps: Optional[float] = None) -> Metadata:
    """The Engram keys of ``info`` under the current spelling (SPEC §6 table, types as there).

    ``optional_keys`` adds ``offsets``, ``head_count``, ``key_length`` and
    ``max_ngram_size``; ``eps`` adds ``{arch}.attention.layer_norm_rms_epsilon``.
    """
    lay, p = info.layout, f"{info.architecture}.engram."
    U32, U64, ARR = GGUFValueType.UINT32, GGUFValueType.UINT64, GGUFValueType.ARRAY
    md: Metadata = {
        p + "encoding": (info.encoding, GGUFValueType.STRING, None),
        p + "layer_ids": ([int(x) for x in lay.layer_ids], ARR, U32),
        p + "rows": ([int(x) for x in lay.rows], ARR, U32),
        p + "compressed_vocab_size": (lay.compressed_vocab_size, U32, None),
        p + "pad_id": (lay.pad_id, U32, None),
        p + "token_map": (info.token_map.astype(np.int64).tolist(), ARR, U32),
        p + "primes": (lay.primes.astype(np.int64).reshape(-1).tolist(), ARR, U32),
        p + "multipliers": ([int(x) for x in lay.multipliers.reshape(-1)], ARR, U64),
    }
    if optional_keys:
        md[p + "offsets"] = (lay.offsets.astype(np.int64).reshape(-1).tolist(), ARR, U32)
        md[p + "head_count"] = (lay.heads, U32, None)
        md[p + "key_length"] = (ROW_VALUES, U32, None)
        md[p + "max_ngram_size"] = (lay.max_ngram, U32, None)
    if eps is not None:
        md[f"{info.architecture}.{EPS_KEY}"] = (float(eps), GGUFValueType.FLOAT32, None)
    return md


def _repaired_metadata(info: ModelInfo, h: Header, eps: Optional[float]) -> Metadata:
    """The first shard's entries with the Engram keys replaced by their current spelling."""
    old = _field_values(h)
    engram = set(family_keys(info.metadata))
    optional = any(k.split(".", 2)[-1] in ("offsets", "head_count", "key_length", "max_ngram_size")
                   for k in engram if ".engram." in k)
    if eps is None and info.sources["eps"].kind != "default":
        eps = info.eps
    md = {k: v for k, v in old.items() if k not in engram}
    md.update(engram_metadata(info, optional_keys=optional, eps=eps))
    return md


# ====================================================================== data
def _copy_range(src: int, dst: int, src_off: int, dst_off: int, n: int, bar) -> None:
    """Copy ``n`` bytes, skipping holes of ``src`` (they stay holes in the pre-sized ``dst``)."""
    end = src_off + n
    pos = src_off
    while pos < end:
        try:
            data = os.lseek(src, pos, os.SEEK_DATA)
            hole = min(end, os.lseek(src, data, os.SEEK_HOLE)) if data < end else end
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data after pos
                data = hole = end
            elif exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # no hole support: copy it all
                data, hole = pos, end
            else:
                raise
        if bar is not None and data > pos:
            bar.update(min(data, end) - pos)
        _copy_bytes(src, dst, data, dst_off + (data - src_off), hole - data, bar)
        pos = hole


def _copy_bytes(src: int, dst: int, at: int, to: int, n: int, bar) -> None:
    while n > 0:
        step = min(n, COPY_CHUNK)
        try:
            done = os.copy_file_range(src, dst, step, at, to)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            buf = os.pread(src, step, at)
            done = os.pwrite(dst, buf, to) if buf else 0
        if done <= 0:
            raise FormatError(f"copying tensor data: the source ended at byte offset {at} ({n} bytes short)")
        at, to, n = at + done, to + done, n - done
        if bar is not None:
            bar.update(done)


def _write_shard(h: Header, md: Metadata, out: Path, bar) -> None:
    """One shard: ``md`` and ``h``'s tensor infos by ``GGUFWriter``, then each tensor's data copied.

    A failure to write raises the ``OSError`` (the caller names the final
    path); a failure to read ``h.path`` raises :class:`TableIOError` naming it.
    """
    arch = md.get("general.architecture", (ARCHITECTURES[0],))[0]
    w = ArrayWriter(out, arch)
    w.kv_data[0].clear()
    w.data_alignment = h.alignment
    for key, (value, vtype, sub) in md.items():
        w.add_key_value(key, value, vtype, sub)
    for t in h.tensors:
        w.add_tensor_info(t.name, tuple(reversed(t.dims)), np.dtype(np.int8), t.nbytes, raw_dtype=t.ggml_type)
    try:
        w.write_header_to_file(out)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        at = pad(w.fout[0].tell(), h.alignment)
    finally:
        w.close()
    places = []
    for t in h.tensors:
        places.append((t, at))
        at += pad(t.nbytes, h.alignment)
    try:
        src = os.open(h.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise TableIOError(f"{h.path}: cannot open to copy its tensors ({exc.strerror})", errno_=exc.errno) from None
    try:
        dst = os.open(out, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.ftruncate(dst, at)
            for t, to in places:
                _copy_tensor(h, t, src, dst, to, out, bar)
            os.fsync(dst)
        finally:
            close_quietly(dst)
    finally:
        close_quietly(src)


def _copy_tensor(h: Header, t, src: int, dst: int, to: int, out: Path, bar) -> None:
    """Tensor ``t``'s data from ``h.path`` to ``dst`` at ``to``; a failure other than to write names the source."""
    try:
        _copy_range(src, dst, h.data_offset + t.rel_offset, to, t.nbytes, bar)
    except EngramError:
        raise
    except OSError as exc:
        if exc.errno in WRITE_ERRNOS:
            raise
        raise TableIOError(f"{h.path}: copying tensor {t.name} to {out.name} failed ({exc.strerror})",
                           offset=h.data_offset + t.rel_offset, errno_=exc.errno or 0) from None


# ====================================================================== repair
def _repair_outputs(headers, dst: Path) -> List[Path]:
    """The files a repair of ``headers`` (one per shard) writes as ``dst``: ``dst`` itself, or its split
    set's names; ``ArgumentError`` when one of them is an input."""
    n = len(headers)
    outs = [dst] if n == 1 else [shard_name(dst, i + 1, n) for i in range(n)]
    ins = {h.path.resolve() for h in headers}
    if any(o.resolve() in ins for o in outs):
        raise ArgumentError(f"repair writes a new file: {dst} is one of the inputs")
    return outs


def repair_model(src: Union[PathLike, Sequence[PathLike]], dst: PathLike, *, prefer: Optional[str] = None,
                 eps: Optional[float] = None, progress: Union[bool, str] = True,
                 parents: bool = False) -> List[Path]:
    """Write ``src`` again as ``dst`` with the current Engram keys, every derived constant re-derived and checked.

    Parameters
    ----------
    src : path or sequence of paths
        A model as :func:`engram.read_model` takes it (any shard of a split set).
    dst : path
        Output ``.gguf``; a split set of ``N`` shards is written as
        ``DST_STEM-0000k-of-0000N.gguf`` beside it.  Written through
        :func:`atomic_outputs`: nothing appears under a final name until every
        shard is complete.
    prefer : str, optional
        ``"deepseek41"`` or ``"deepseek4"``: where the two spellings of a
        primary key (primes, multipliers, token map, pad id, layer ids,
        encoding) disagree, keep this one's value.  Without it such a file is
        refused.
    eps : float, optional
        Write this gate epsilon (``{arch}.attention.layer_norm_rms_epsilon``);
        default: the file's own, or none when it has none.
    progress : bool or str
        A tqdm progress bar over the bytes copied, on standard error: ``True`` (default) or ``"auto"`` only
        where standard error is a terminal, ``"bar"`` anywhere, ``False`` or ``"off"`` none (:func:`bar_wanted`).
    parents : bool
        Make the folder of ``dst`` (and its parents) when missing; without it a
        missing folder is refused (:func:`check_outputs`).

    Returns
    -------
    list of pathlib.Path
        The files written (first shard first).

    Raises
    ------
    FormatError
        The primary keys are missing, contradict each other or the tensors
        (e.g. a table tensor whose row count is not the sum of its primes):
        nothing is written then.
    ArgumentError
        ``dst`` is one of the inputs, ``prefer`` or ``eps`` is invalid.
    OutputError
        ``dst`` cannot be written: it (or a shard's name) exists and is not a
        regular file (a directory, device, FIFO or socket: never replaced),
        its folder is missing (without ``parents``), too little room (checked
        before writing),
        a read-only or full file system, no permission, a file where a folder
        is needed; names ``dst`` and the reason.  Nothing is left under a final
        name, and nothing half-written (as for an interrupt).
    TableIOError
        Reading the tensor data of ``src`` failed (names the file).
    """
    if prefer is not None and prefer not in ARCHITECTURES:
        raise ArgumentError(f"prefer must be one of {list(ARCHITECTURES)}, got {prefer!r}")
    bar_wanted(progress)  # a bad value is refused before anything is read or made
    if eps is not None and not (isinstance(eps, (int, float)) and 0 < float(eps) < 1):
        raise ArgumentError(f"eps must be a number in (0, 1), got {eps!r}")
    headers = read_headers(src)
    keys = engram_keys(headers[0], engram_layer_ids(headers), derive_only=True, prefer=prefer)
    try:
        info = model_info(headers, keys)
    except FormatError as exc:
        raise FormatError(f"cannot repair: the constants derived from the primary keys contradict the tensors: "
                          f"{exc}") from None
    dst = Path(dst)
    outs = _repair_outputs(headers, dst)
    need = sum(os.stat(h.path).st_blocks * 512 for h in headers) + (16 << 20)
    check_outputs(outs, parents)
    check_room(dst, need, "repairing")
    mds = [_repaired_metadata(info, headers[0], eps)] + [_field_values(h) for h in headers[1:]]
    total = sum(t.nbytes for h in headers for t in h.tensors)
    with atomic_outputs(outs) as temps, progress_bar(progress, total, f"repair {dst.name}") as bar:
        for h, md, tmp, final in zip(headers, mds, temps, outs):
            try:
                _write_shard(h, md, tmp, bar)
            except EngramError:
                raise
            except OSError as exc:
                raise output_error(final, exc) from None
        _verify(info, temps)
    return outs


def _verify(before: ModelInfo, temps: List[Path]) -> None:
    """The written files read back with the same layout, token map and tensors, every key current."""
    after = read_model(temps if len(temps) > 1 else temps[0])
    legacy = [k for k in after.metadata if k in family_keys(after.metadata)
              and not k.startswith(after.architecture + ".")]
    if after.layout != before.layout or not np.array_equal(after.token_map, before.token_map) or legacy \
            or set(after.tensors) != set(before.tensors) \
            or any(after.tensors[n].nbytes != t.nbytes for n, t in before.tensors.items()):
        raise FormatError(f"repair: the file written does not read back as the model it came from "
                          f"(legacy keys left: {legacy})")  # pragma: no cover - guards the writer
