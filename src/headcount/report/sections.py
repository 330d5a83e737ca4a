"""report.json as one typed object, ReportData: what the page (html.py and the measures' cards), the claims
(claims.py) and the summary read. Each section's dataclass lives with its measure in report/measures/.

    ReportData.from_json(report) -> ReportData   (refuses another format version: one line, "rebuild it")
    check_format(report)                          that check alone (the page builder runs it)
    Rank.from_json(report["rank"]).to_json()      every section: the same JSON back (section_base.Section)

Each class names the keys the readers use (a key without a default is required); the others stay in `more`.
FORMAT is report.json's version: bump it whenever a section's meaning or layout changes, so that a page is never
built from a file this code would misread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# each section is declared with its measure (report/measures/); they are gathered here for ReportData, and
# re-exported for the claims and the summary, which read them from this module
from headcount.report.measures.checks import (ChapterMemory, Checks, FlopCheck, FlopRow,  # noqa: F401
                                              FusedCheck, KVCheck, MeasuredMemory, MemoryCheck, ParamCheck,
                                              ParamRow, PresetShape, ShapeCheck, WriteGeometry)
from headcount.report.measures.edits import Domains, Edit, TaskScores  # noqa: F401
from headcount.report.measures.experiments import (Experiment, ExperimentData, HeadsSweepRow,  # noqa: F401
                                                   LowRankRow, MultiRelationRow, OneHead, WriteAddressRow)
from headcount.report.measures.faithfulness import FaithfulHead, Faithfulness  # noqa: F401
from headcount.report.measures.gates import GatePoint, Gates  # noqa: F401
from headcount.report.measures.healing import Healing, HeldOut  # noqa: F401
from headcount.report.measures.importance import Importance  # noqa: F401
from headcount.report.measures.kv_merge import Merge  # noqa: F401
from headcount.report.measures.pruning import PrunePoint, Pruning  # noqa: F401
from headcount.report.measures.rank import HeadRank, Rank, RankRow  # noqa: F401
from headcount.report.measures.roles import Role  # noqa: F401
from headcount.report.measures.sample import Sample  # noqa: F401
from headcount.report.measures.shape import AccountRow, Accounts, Shape, SlidingWindow  # noqa: F401
from headcount.report.section_base import Section

FORMAT = 3  # report.json's format version (3: typed sections; a K/V merge is the command's or the report's text's)


def check_format(report) -> None:
    """A ValueError in one line unless `report` is a report.json of this FORMAT."""
    got = report.get("format") if isinstance(report, dict) else None
    if got != FORMAT:
        model = report.get("model") if isinstance(report, dict) else None
        raise ValueError(f"report.json: format {got!r}, this headcount reads format {FORMAT}; rebuild it: "
                         f"headcount report --model {model or 'MODEL'} --force")


# ------------------------------------------------------------------------------------- the model
# ---------------------------------------------------------------------------------------- surgery
# ------------------------------------------------------------------------------------------ report
@dataclass
class Params(Section):
    """How the report was run."""
    seed: int | None = None
    quick: bool = False
    text: str | None = None


@dataclass
class Claim(Section):
    """One of the chapter's fifteen claims as claims.read_claims states it."""
    id: str
    title: str
    claim: str
    test: str
    status: str
    finding: str
    number: Any = None
    source: str | None = None


@dataclass
class ReportData(Section):
    format: int
    model: str | None = None
    kind: str | None = None
    shape: Shape | None = None
    accounts: Accounts | None = None
    sample: Sample | None = None
    roles: dict[str, Role] | None = None
    importance: Importance | None = None
    faithfulness: Faithfulness | None = None
    rank: Rank | None = None
    checks: Checks | None = None
    pruning: Pruning | None = None
    prune_command: Edit | None = None
    kv_merge: Merge | None = None
    healing: Healing | None = None
    gates: Gates | None = None
    experiments: dict[str, Experiment] = field(default_factory=dict)
    params: Params | None = None
    unavailable: dict = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)  # claims.read_claims's output, when assembled

    @classmethod
    def from_json(cls, data, where: str | None = None):
        if not isinstance(data, cls):
            check_format(data)
        return super().from_json(data, where or "report")
