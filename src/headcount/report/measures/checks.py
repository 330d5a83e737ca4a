"""The chapter's arithmetic claims measured on the model (C2 fused vs reference, C3 write geometry, C4-C6 the
accounts against numel / FlopCounterMode / the measured peak, C10 shapes, C14 the KV cache): their step and typed
sections (the claims read them; the page shows them through the claims)."""

from __future__ import annotations

from dataclasses import dataclass, field

from headcount.report.checks import chapter_checks
from headcount.report.context import Context, Step
from headcount.report.section_base import Section

NAME = "checks"


def step(ctx: Context) -> dict:
    return chapter_checks(ctx.model, ctx.sample)


def steps(ctx: Context) -> list[Step]:
    return [Step(NAME, {"sentence": ctx.sample, "version": 3}, step)]


@dataclass
class FusedCheck(Section):  # C2
    layer: int
    tokens: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_abs_diff: float
    max_abs_output: float
    relative_diff: float
    view_moves_no_data: bool = False
    transposed_q_contiguous: bool = False
    rotary: str = "left out"


@dataclass
class WriteGeometry(Section):  # C3 on the model
    own_slice_energy: float | None = None
    slice_share: float = float("nan")
    reach: float = float("nan")
    mean_overlap: float = float("nan")


@dataclass
class ParamRow(Section):
    n_heads: int
    measured: int
    formula: int
    n_kv_heads: int | None = None
    head_dim: int | None = None


@dataclass
class ParamCheck(Section):  # C4
    d_model: int
    four_d2: int
    mha: list[ParamRow]
    model: ParamRow


@dataclass
class FlopRow(Section):
    label: str
    n_heads: int
    measured: int
    formula: int


@dataclass
class FlopCheck(Section):  # C5
    seq: int
    d_model: int
    four_n2_d: int
    two_n2_d: int
    rows: list[FlopRow]


@dataclass
class ChapterMemory(Section):
    n_heads: int
    gib: float
    chapter_gib: float


@dataclass
class MeasuredMemory(Section):
    n_heads: int
    seq: int
    peak_bytes: float
    formula: float


@dataclass
class MemoryCheck(Section):  # C6
    chapter: list[ChapterMemory]
    measured: list[MeasuredMemory] = field(default_factory=list)
    tolerance: float = 0.1


@dataclass
class PresetShape(Section):
    n_heads: int
    head_dim: int
    d_model: int
    preset: str | None = None
    chapter_n_heads: int | None = None
    n_kv_heads: int | None = None


@dataclass
class ShapeCheck(Section):  # C10
    presets: list[PresetShape]
    decoupled: PresetShape
    model: PresetShape


@dataclass
class KVCheck(Section):  # C14
    dtype: str
    measured: int
    formula: int
    by_hand: int
    n_kv_heads: int
    head_dim: int
    n_layers: int
    bytes: int


@dataclass
class Checks(Section):
    c2: FusedCheck | None = None
    c3_geometry: WriteGeometry | None = None
    c4: ParamCheck | None = None
    c5: FlopCheck | None = None
    c6: MemoryCheck | None = None
    c10: ShapeCheck | None = None
    c14: KVCheck | None = None
