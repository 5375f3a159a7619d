"""One flag, one meaning, everywhere: every command that can take a while takes ``--no-progress`` and
``--quiet``, declared once (:func:`engram.cli.add_progress_flags`), read once (:func:`engram.cli.progress_choice`)."""

from __future__ import annotations

import argparse

import pytest

from engram.cli import NO_PROGRESS_HELP, QUIET_HELP, build_parser, plugin_commands, progress_choice

#: Commands that answer at once (headers, a listing, a fit of a small file): no progress to show.  Every other
#: command -- present or added later -- must take both flags.
QUICK = {
    "engram info",      # the build and this machine's backends
    "engram hash",      # row ids of a text: the hash runs at millions of tokens a second
    "engram inspect",   # headers only
    "engram lookup",    # one prompt's rows, read once
    "engram calibrate",  # a fit of microbench.json
    "engram sim device",  # a device model's table
    "engram sim trace iolog",  # the reads of a trace written out, one pass
}


def every_parser() -> dict:
    """Every command's parser of ``engram`` with every plugin loaded, by program name (sub-subcommands too)."""
    out = {}
    names = ["info", *plugin_commands()]
    for name in names:
        todo = [build_parser([name])]
        while todo:
            p = todo.pop()
            if p.prog not in out or p.get_default("func"):  # a loaded command over the stub that lists it
                out[p.prog] = p
            for a in p._actions:
                if isinstance(a, argparse._SubParsersAction):
                    todo.extend(a.choices.values())
    return out


def leaves() -> dict:
    """The parsers that run a command: those with a ``func`` default (a group's parser only lists its own)."""
    return {prog: p for prog, p in every_parser().items() if prog != "engram" and p.get_default("func")}


def test_the_walk_finds_every_kind_of_command():
    progs = set(leaves())
    # the engine's, the simulator's top level, sim's subcommands, and trace's sub-subcommands
    for want in ("engram synth", "engram repair", "engram demo", "engram report", "engram measure",
                 "engram crosscheck", "engram sim decode", "engram sim serve", "engram sim capacity",
                 "engram sim sweep", "engram sim prefill", "engram sim trace synth", "engram sim trace stats",
                 "engram sim trace profile", "engram sim trace reuse", *QUICK):
        assert want in progs, want
    assert len(progs) == 23  # 6 engine commands, 5 top-level simulator ones, 6 of sim, trace and its 5


@pytest.mark.parametrize("prog", sorted(set(leaves()) - QUICK))
def test_every_long_command_takes_both_flags_with_one_meaning(prog):
    p = leaves()[prog]
    by_flag = {o: a for a in p._actions for o in a.option_strings}
    assert "--no-progress" in by_flag and "--quiet" in by_flag, f"{prog} refuses a progress flag"
    assert by_flag["--no-progress"].help == NO_PROGRESS_HELP
    assert by_flag["--quiet"].help == QUIET_HELP
    assert by_flag["--no-progress"].dest == "no_progress" and by_flag["--quiet"].dest == "quiet"


@pytest.mark.parametrize("prog", sorted(set(leaves()) - QUICK))
def test_every_long_command_parses_both_flags_to_the_same_modes(prog):
    p = leaves()[prog]
    required = [a for a in p._actions if not a.option_strings and a.nargs is None]
    req_opts = [a for a in p._actions if a.option_strings and a.required]
    req_opts += [g._group_actions[0] for g in p._mutually_exclusive_groups if g.required]
    argv = ["x"] * len(required)
    for a in req_opts:  # a required option (prefill's compute, reuse's sizes) gets a value of its type
        argv += [a.option_strings[0], "1M" if a.option_strings[0] == "--cache-bytes" else "1"]
    for flags, mode in (([], "auto"), (["--no-progress"], "lines"), (["--quiet"], "off"),
                        (["--no-progress", "--quiet"], "off")):
        args = p.parse_args(argv + flags)
        assert progress_choice(args) == mode, (prog, flags)


def test_quick_commands_are_real_commands_without_the_flags():
    found = leaves()
    for prog in QUICK:
        assert prog in found
        assert "--quiet" not in {o for a in found[prog]._actions for o in a.option_strings}, \
            f"{prog} takes --quiet: move it out of QUICK"


def test_serve_and_trace_synth_take_no_progress(capsys):
    """The two commands the flag was refused by: both now run with it (and print no progress when quiet)."""
    from engram.cli import main
    assert main(["sim", "trace", "synth", "--reuse", "0.2", "--tokens", "300", "--lru", "64", "--no-progress",
                 "--json"]) == 0
    assert main(["sim", "serve", "--rate", "2", "--duration-s", "2", "--trace-limit", "4096", "--quiet",
                 "--json"]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "arrival" not in err
