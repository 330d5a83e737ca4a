"""The four experiments by name, and the one entry point that runs them.

    run_experiment("multi-relation", quick=True, seed=0) -> ExperimentResult
    EXPERIMENTS["low-rank"].claim / .section / .module

Each experiment lives in its own module with run(**kw), format_text(result) and plot(result, ax).
Threads: torch.set_num_threads is set here only, for the run, and restored afterwards: min(2, CPUs
not already busy) for the language models (train.available_cpus), or exactly `threads=`. The two tiny
experiments (one attention layer on 12-16 tokens; one head on 8-16 positions) use ONE thread: their
matrices are too small to split, and on a shared 2-core machine a second thread spends its time
waiting (measured: 18 ms per multi-relation step with 1 thread, 260 ms with 2, at load average 15).
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

from headcount.arguments import positive_int
from headcount.experiments.results import ExperimentResult


@dataclass(frozen=True)
class Experiment:
    name: str
    section: str  # the chapter's section
    claim: str
    module: str  # headcount.experiments.<module>: run, format_text, plot
    threads: int  # torch threads for the run (at most the CPUs available)

    def load(self):
        return importlib.import_module(f"headcount.experiments.{self.module}")


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("multi-relation", "2.3.1", "one head gives one weighted average; n heads give n", "multi_relation", 1),
    Experiment("heads-sweep", "2.3.5", "at fixed d_model the head count has a broad optimum; extremes lose",
               "heads_sweep", 2),
    Experiment("low-rank", "2.3.5", "one head's score matrix has rank <= head_dim (Bhojanapalli et al. 2020)",
               "low_rank", 1),
    Experiment("write-address", "2.3.2", "W_O's i-th block of columns is head i's write address", "write_address", 2),
)}


def get_experiment(name) -> Experiment:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def run_experiment(name: str, *, quick: bool = False, seed: int = 0, steps: int | None = None,
                   seeds: int | None = None, progress: bool = True, threads: int | None = None,
                   **options) -> ExperimentResult:
    """Run one experiment. quick: the small version the tests use (under a minute). seed: the first seed;
    seeds: how many (seed, seed + 1, ...); steps: training steps per model (default: the experiment's).
    options: the experiment's own settings (e.g. heads=(1, 2, 4), d_model=64); unknown ones are an error."""
    experiment = get_experiment(name)
    positive_int("seed", seed, 0, expected="a whole number >= 0")
    positive_int("steps", steps, none=True, expected="a positive number of training steps")
    positive_int("seeds", seeds, none=True, expected="a positive number of seeds")
    positive_int("threads", threads, none=True, expected="a positive number of threads")
    from headcount.experiments.train import cpu_threads

    module = experiment.load()
    start = time.perf_counter()
    with cpu_threads(experiment.threads if threads is None else threads, exact=threads is not None) as used:
        result = module.run(quick=quick, seed=seed, steps=steps, seeds=seeds, progress=progress, **options)
    result.seconds = time.perf_counter() - start
    result.config["torch_threads"] = used
    return result


def format_text(result: ExperimentResult) -> str:
    """The experiment's table(s) and notes as text."""
    return get_experiment(result.experiment).load().format_text(result)


def save_plot(result: ExperimentResult, path) -> None:
    from headcount.experiments.plots import save_plot as save
    save(result, path, get_experiment(result.experiment).load().plot)
