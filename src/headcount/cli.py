"""The `headcount` command.

Each room registers its own commands (``register(app)``) so this file stays a switchboard. A command that needs
a room above its own gets it here, as an argument of register (`generate --tp`: models.cli.register(tp_setup=)).
Nothing here imports torch at module level: `headcount cost` must answer instantly.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Multi-head attention you can build, measure and dissect.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks measured side by side against torch / transformers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _register_all() -> None:
    from headcount.cost import cli as cost_cli
    from headcount.models import cli as models_cli
    from headcount import demo as demo_cli
    from headcount.analysis import cli as analysis_cli
    from headcount.surgery import cli as surgery_cli
    from headcount.report import cli as report_cli
    from headcount.experiments import cli as experiments_cli
    from headcount.parallel import cli as parallel_cli
    from headcount.engines import cli as engines_cli
    from headcount.tasks import cli as tasks_cli
    from headcount.frontier import cli as frontier_cli

    cost_cli.register(app)
    # the hooks across rooms: models sits below parallel and engines, so `generate --tp` gets parallel's setup and
    # `bench decode --task` engines' vLLM run from here
    models_cli.register(app, bench_app, tp_setup=parallel_cli.tp_setup, task_decode=engines_cli.task_decode)
    demo_cli.register(app, bench_app)
    for room in (analysis_cli, tasks_cli, surgery_cli, report_cli, frontier_cli, experiments_cli, parallel_cli,
                 engines_cli):
        room.register(app, bench_app)


_register_all()


def main() -> None:  # console-script entry point
    app()


if __name__ == "__main__":
    main()
