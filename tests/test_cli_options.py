"""The shared command-line options mean the same everywhere: every command's --model, --dtype, --device, --json,
--png and --eval has the help cli_options declares, so a flag read in one command's --help reads the same in all.
The few commands whose flag means something else say so here, with the reason."""

import typer

from headcount import cli_options as opts
from headcount.cli import app

SHARED = {"--model": opts.MODEL_HELP, "--dtype": opts.DTYPE_HELP, "--device": opts.DEVICE_HELP,
          "--json": "print JSON", "--png": "also write the figure to this PNG file", "--eval": opts.EVAL_HELP}
# (command, flag) -> why its help differs
OTHER_MEANING = {
    ("cost", "--dtype"): "the accounts' precision (fp8 and int8 too), not the weights a model is loaded in",
    ("cost", "--json"): "cost sits on the base layer beside cli_options and declares its own",
    ("heal", "--model"): "the edited model, beside --teacher",
    ("heal", "--eval"): "its stage before the edit is the teacher's",
    ("bench surgery", "--png"): "one of several figures the bench writes",
}


def _commands(cmd, path=()):
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, path + (name,))
    else:
        yield " ".join(path), cmd


def test_every_shared_flag_has_the_shared_help():
    differ = {}
    for name, cmd in _commands(typer.main.get_command(app)):
        for param in cmd.params:
            for flag, help_ in SHARED.items():
                if flag in getattr(param, "opts", ()) and param.help != help_ and (name, flag) not in OTHER_MEANING:
                    differ[name, flag] = param.help
    assert not differ, differ


def test_the_commands_are_found():
    names = {name for name, _ in _commands(typer.main.get_command(app))}
    assert {"cost", "perplexity", "generate", "roles", "rank", "report", "prune", "bench decode"} <= names
