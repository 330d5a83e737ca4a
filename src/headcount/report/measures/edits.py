"""What the three edit sections share (prune_command, kv_merge, healing): the held-out domains before / after an
edit, and Edit, the section of an edit the commands make (their saved --json, or their defaults run here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headcount.report.section_base import Section


@dataclass
class Domains(Section):
    """The three held-out domains before / after an edit (the names the commands' --json uses), or why not."""
    ppl_by_domain_before: dict | None = None
    ppl_by_domain_after: dict | None = None
    domain_sizes: dict | None = None  # {domain: [windows, tokens per window]}
    domains_note: str | None = None


@dataclass
class TaskScores(Section):
    """One task's pass@1 at each stage of an edit (--eval), and its paired comparisons against before the edit."""
    before_edit: float | None = None
    after_edit: float | None = None
    after_heal: float | None = None
    paired: dict | None = None  # {stage: {wins, losses, p_value, ...}}


@dataclass
class Edit(Domains):
    """prune_command, kv_merge, healing: an edit the commands make, saved / run here ("saved", "run"), or the
    K/V merge on the report's own text ("text")."""
    source: str = "run"
    command: str | None = None
    path: str | None = None
    weights_sha256: str | None = None
    fraction: float | None = None
    order: Any = None
    compensate: Any = None
    mode: str | None = None
    method: str | None = None
    heads_before: int | None = None
    heads_after: int | None = None
    heads_removed: int | None = None
    ppl_before: float | None = None
    ppl_after: float | None = None
    cosine: float | None = None
    options: dict | None = None
    uptrain: dict | None = None
    tasks: dict[str, TaskScores] | None = None  # {task: its pass@1 per stage}, from a saved command result
