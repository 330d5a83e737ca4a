"""The chapter's fifteen claims (C1-C15, listed in DESIGN.md) next to what this model showed: held,
partly, did not hold, or not measured.

    read_claims(report) -> 15 x {"id", "title", "claim", "test", "status", "finding", "number", "source"}
    READERS: {claim id: reader(ReportData) -> that claim}   the table read_claims runs, C1 to C15

Each reading states its test (the threshold it uses) so a reader can disagree with the threshold and
still use the number, and its source: measured on the model in the report's run, a saved full run of an
experiment (benchmarks/results/), or an experiment's --quick run. A claim that does not hold on the model
is reported as such, with its number. Reads only report.json (as sections.ReportData), never a model; the readers
themselves are in claims_model.py (the model's own measures), claims_edits.py (pruning, gates, the K/V merge) and
claims_trained.py (the experiments trained from scratch).
"""

from __future__ import annotations

from headcount.report.claims_edits import GATES_FILE, c11_pruning, c12_gates, c15_gqa  # noqa: F401 (the page's)
from headcount.report.claims_model import (c2_fused, c4_params, c5_flops, c6_memory, c7_roles, c9_rank, c10_shapes,
                                           c13_faithfulness, c14_kv)
from headcount.report.claims_trained import c1_multi_relation, c3_write_address, c8_heads_sweep
from headcount.report.sections import Checks, ReportData
from headcount.report.verdicts import (NOT_AVAILABLE, NOT_MEASURED, ROLE_NAMES, STATUSES, command_source,  # noqa: F401
                                       domain_table, head_name, merge_how, role_score, run_source)

CLAIM_IDS = tuple(f"C{i}" for i in range(1, 16))
NO_CHECKS = Checks()  # a report without the chapter checks: each of their claims is "not measured"


def _checks(r: ReportData) -> Checks:
    return r.checks if r.checks is not None else NO_CHECKS


def _measured_here(found: dict, r: ReportData, note: str = "") -> dict:
    """A claim measured on the report's model whose reader named no source: this report's run."""
    if found["status"] != NOT_MEASURED and found["source"] == NOT_AVAILABLE:
        found["source"] = run_source(r.model) + note
    return found


READERS = {
    "C1": lambda r: c1_multi_relation(r.experiments.get("multi-relation")),
    "C2": lambda r: c2_fused(_checks(r).c2, r.model),
    "C3": lambda r: c3_write_address(r.experiments.get("write-address"), _checks(r).c3_geometry, r.model),
    "C4": lambda r: c4_params(_checks(r).c4, r.model),
    "C5": lambda r: c5_flops(_checks(r).c5, r.model),
    "C6": lambda r: c6_memory(_checks(r).c6, r.model),
    "C7": lambda r: _measured_here(c7_roles(r.roles), r),
    "C8": lambda r: c8_heads_sweep(r.experiments.get("heads-sweep")),
    "C9": lambda r: c9_rank(r.rank, r.shape.head_dim if r.shape is not None else None, r.experiments.get("low-rank"),
                            r.model),
    "C10": lambda r: c10_shapes(_checks(r).c10, r.model),
    "C11": lambda r: _measured_here(c11_pruning(r.pruning, r.prune_command, r.model), r,
                                    " (with the project's default pruning order and compensation)"),
    "C12": lambda r: c12_gates(r.gates, r.model),
    "C13": lambda r: _measured_here(c13_faithfulness(r.faithfulness), r),
    "C14": lambda r: c14_kv(_checks(r).c14, r.model, r.accounts),
    "C15": lambda r: _measured_here(c15_gqa(r.accounts, r.kv_merge, r.unavailable.get("kv_merge"), r.model), r),
}
assert tuple(READERS) == CLAIM_IDS


def read_claims(report: dict | ReportData) -> list[dict]:
    """All fifteen claims, C1 to C15, from report.json (a ValueError for another format version)."""
    data = ReportData.from_json(report)
    return [READERS[cid](data) for cid in CLAIM_IDS]
