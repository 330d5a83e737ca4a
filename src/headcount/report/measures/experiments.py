"""The chapter's experiments trained from scratch (C1, C3, C8, C9): their sections, one per experiment."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from headcount.report.context import Context, Step
from headcount.report.section_base import Section
from headcount.report.trained import EXPERIMENT_NAMES, experiment_section, experiment_source

NAME = "experiments"  # report.json's key: {name: Experiment}, one step per experiment ("experiment-<name>")


@dataclass
class MultiRelationRow(Section):  # C1
    n_heads: int
    accuracy: float
    accuracy_seeds: list = field(default_factory=list)
    attention_params: Any = None


@dataclass
class OneHead(Section):  # C1: multi-relation's details["one_head"]
    mass_on_marked: list = field(default_factory=list)
    distance_to_average: float | None = None


@dataclass
class WriteAddressRow(Section):  # C3
    variant: str | None = None
    loss: float | None = None
    loss_std: float | None = None


@dataclass
class HeadsSweepRow(Section):  # C8
    n_heads: int
    head_dim: int
    ppl_mean: float
    ppl_std: float | None = None


@dataclass
class LowRankRow(Section):  # C9
    head_dim: int
    error: float
    setting: str = "one head"
    n_heads: int | None = None


@dataclass
class ExperimentData(Section):
    results: list = field(default_factory=list)  # rows, one kind per experiment (claims.py types them)
    config: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)


@dataclass
class Experiment(Section):
    source: str
    result: ExperimentData
    path: str | None = None
    command: str | None = None
    seeds: int | None = None
    steps: int | None = None

    def rows(self, kind: type[Section]) -> list:
        return [kind.from_json(r, f"{self.command}: results") for r in self.result.results]


def step(name: str, ctx: Context) -> dict:
    return experiment_section(name, results=ctx.results_dir, seed=ctx.seed, progress=ctx.progress)


def steps(ctx: Context) -> list[Step]:
    """One step per experiment, report.json's experiments[name]: the same whichever model the report is on."""
    return [Step(f"experiment-{name}", {"seed": ctx.seed} | experiment_source(name, ctx.results_dir),
                 functools.partial(step, name), model_free=True) for name in EXPERIMENT_NAMES]
