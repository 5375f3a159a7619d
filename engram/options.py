"""Command-line options as data: the :class:`Option` table form and the one function that adds a table
to an :mod:`argparse` parser.

A command declares its options as a tuple of :class:`Option` values, in the order ``--help`` lists them,
and :func:`add_options` adds them; the tables that several commands share (the read policy, the device,
the trace source, the progress flags, ...) are written once and joined with ``+``.  So a new option is
one line in one table, and ``--help`` and ``docs/cli.md`` (generated from the parsers) follow it.

The form, field by field (every field but ``flags`` may be left out):

``flags``
    The option strings (``"--seed"``, or several: ``("-o", "--out")``), or one positional name.
``help``, ``type``, ``default``, ``choices``, ``metavar``, ``action``, ``nargs``, ``required``, ``dest``
    What :meth:`argparse.ArgumentParser.add_argument` takes under those names; a field left out is not
    passed at all, so argparse's own defaults stand (``False`` for ``action="store_true"``, ``None``
    otherwise).  Units go into the help text (``"mean compute time of a step, ms"``), as ``--help`` prints
    them.
``group``
    The title of the argument group the option is listed under (``None``: the parser's own options).  A
    group is made when the first option naming its title is added, so groups appear in table order; later
    options with the same title join it.
``exclusive``
    An :class:`Exclusive`: options naming the same one are mutually exclusive (inside their ``group``);
    ``Exclusive(name, required=True)``: one of them must be given.
``requires``
    ``(dest, words)``: the option takes effect only when option ``dest`` has a true value (a count above 0,
    a flag given).  :func:`check_requires` refuses it otherwise, in one line: ``--acceptance takes effect
    only with --draft-tokens K (K >= 1): without it, it would change nothing``; ``words`` say what the
    other option needs (``"K (K >= 1)"``).

:func:`replaced` gives a table with some fields replaced in every option (``default=argparse.SUPPRESS``
on a subcommand that repeats its parent's options).

A command is data too: a :class:`Command` holds its name, its one-line ``help``, its ``description``
(``--help``'s paragraph), its option table, its handler and its subcommands, and :func:`add_command` adds it
(and them) to the parent's subparsers.  So every command is declared the same way, next to its handler.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Tuple, Union

from .errors import ArgumentError


class _Unset:
    """The value of a field left out (not passed to argparse)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Exclusive:
    """A mutually exclusive set of options (``required``: one of them must be given)."""

    name: str
    required: bool = False


@dataclass(frozen=True)
class Option:
    """One command-line option as data (the fields: see the module docstring)."""

    flags: Union[str, Tuple[str, ...]]
    help: Any = UNSET
    type: Optional[Callable] = UNSET
    default: Any = UNSET
    choices: Any = UNSET
    metavar: Any = UNSET
    action: Any = UNSET
    nargs: Any = UNSET
    required: Any = UNSET
    dest: Any = UNSET
    group: Optional[str] = None
    exclusive: Optional[Exclusive] = None
    requires: Tuple[str, ...] = ()

    #: The fields passed to ``add_argument`` as keywords.
    ARGPARSE = ("help", "type", "default", "choices", "metavar", "action", "nargs", "required", "dest")

    @property
    def names(self) -> Tuple[str, ...]:
        """The option strings (or the one positional name) as a tuple."""
        return (self.flags,) if isinstance(self.flags, str) else tuple(self.flags)

    def keywords(self) -> dict:
        """The keywords of ``add_argument``: the fields that are set."""
        return {k: getattr(self, k) for k in self.ARGPARSE if getattr(self, k) is not UNSET}


Table = Tuple[Option, ...]


def add_options(parser: argparse.ArgumentParser, table: Iterable[Option]) -> argparse.ArgumentParser:
    """Add every option of ``table`` to ``parser``, in order: each in its ``group`` (made on first use,
    or found by title among the parser's groups) and its ``exclusive`` set.  Returns ``parser``."""
    groups = {g.title: g for g in parser._action_groups}
    exclusives: dict = {}
    for opt in table:
        where = parser
        if opt.group is not None:
            if opt.group not in groups:
                groups[opt.group] = parser.add_argument_group(opt.group)
            where = groups[opt.group]
        if opt.exclusive is not None:
            key = (opt.group, opt.exclusive)
            if key not in exclusives:
                exclusives[key] = where.add_mutually_exclusive_group(required=opt.exclusive.required)
            where = exclusives[key]
        where.add_argument(*opt.names, **opt.keywords())
    return parser


def replaced(table: Iterable[Option], **changes) -> Table:
    """``table`` with the fields ``changes`` names replaced in every option (e.g.
    ``default=argparse.SUPPRESS``)."""
    unknown = set(changes) - {f.name for f in fields(Option)}
    if unknown:
        raise TypeError(f"Option has no field {sorted(unknown)[0]!r}")
    return tuple(replace(o, **changes) for o in table)


@dataclass(frozen=True)
class Command:
    """One command (or subcommand) as data, added by :func:`add_command`.

    Attributes
    ----------
    name : str
        The command word (``"decode"`` in ``engram sim decode``).
    help : str
        The one line its parent's ``--help`` lists it with.
    options : tuple of Option
        Its options, in ``--help`` order (:func:`add_options`).
    func : callable, optional
        The handler, ``func(args) -> int`` (None: a command that only groups subcommands).
    description : str
        The paragraph of its own ``--help`` (empty: argparse prints none).
    subcommands : tuple of Command
        Commands under it (``engram sim`` -> ``decode``, ...), in ``--help`` order.
    dest, metavar : str
        The namespace attribute that names the subcommand given, and how ``--help`` shows the choice.
    required : bool
        Whether a subcommand must be given.
    defaults : mapping
        More ``set_defaults`` values of the namespace besides ``func``.
    subparsers_action : type, optional
        The ``action`` of its subparsers (an :class:`argparse._SubParsersAction` subclass), when not argparse's.
    default_subcommand : str, optional
        The subcommand run when none is given (needs a ``subparsers_action`` with ``default_to``).
    """

    name: str
    help: str
    options: Table = ()
    func: Optional[Callable] = None
    description: str = ""
    subcommands: Tuple["Command", ...] = ()
    dest: str = ""
    metavar: str = "SUBCOMMAND"
    required: bool = True
    defaults: Mapping[str, Any] = field(default_factory=dict)
    subparsers_action: Optional[type] = None
    default_subcommand: Optional[str] = None


def add_command(subparsers, cmd: Command) -> argparse.ArgumentParser:
    """Add ``cmd`` to ``subparsers`` (a parser's ``add_subparsers()``): its parser, options, handler and
    subcommands.  Returns its parser."""
    kw = {"help": cmd.help}
    if cmd.description:
        kw["description"] = cmd.description
    p = subparsers.add_parser(cmd.name, **kw)
    add_options(p, cmd.options)
    defaults = dict(cmd.defaults)
    if cmd.func is not None:
        defaults["func"] = cmd.func
        defaults["command_prog"] = p.prog  # "engram sim capacity": the command an error names
    if defaults:
        p.set_defaults(**defaults)
    if cmd.subcommands:
        skw = {"dest": cmd.dest or f"{cmd.name}_command", "metavar": cmd.metavar}
        if cmd.subparsers_action is not None:
            skw["action"] = cmd.subparsers_action
        sub = p.add_subparsers(**skw)
        sub.required = cmd.required
        for c in cmd.subcommands:
            add_command(sub, c)
        if cmd.default_subcommand is not None:
            sub.default_to(cmd.default_subcommand)
    return p


def _dest(opt: Option) -> str:
    if opt.dest is not UNSET:
        return opt.dest
    longs = [n for n in opt.names if n.startswith("--")]
    return (longs or list(opt.names))[0].lstrip("-").replace("-", "_")


def _flag(opt: Option) -> str:
    longs = [n for n in opt.names if n.startswith("--")]
    return (longs or list(opt.names))[0]


def check_requires(table: Sequence[Option], args: argparse.Namespace,
                   values: Optional[Mapping[str, Any]] = None) -> None:
    """Refuse an option of ``table`` given in ``args`` (its value is not its default) whose ``requires``
    option has no true value in ``values`` (default: ``args`` itself; a command whose values are merged
    from several places passes the merged ones).

    Raises
    ------
    ArgumentError
        One line naming both options: the first option given without what it requires.
    """
    by_dest = {_dest(o): o for o in table}
    have = vars(args) if values is None else values
    for opt in table:
        if not opt.requires:
            continue
        dest, words = opt.requires
        default = None if opt.default is UNSET else opt.default
        if opt.action in ("store_true",) and opt.default is UNSET:
            default = False
        if getattr(args, _dest(opt), default) == default or have.get(dest):
            continue
        other = _flag(by_dest[dest]) if dest in by_dest else "--" + dest.replace("_", "-")
        raise ArgumentError(f"{_flag(opt)} takes effect only with {other} {words}: without it, it would change "
                            "nothing")
