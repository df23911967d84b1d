"""The paper's figure beside ours: one row per reproduced figure, with a verdict.

One idea: a reproduced finding is a comparison of two numbers measured under two stated setups,
so a finding suite's table row carries both setups, the paper's value, our per-block values
(median and range across blocks, `block_figures.put`) and a verdict computed by one rule for
every suite (`verdict`). The paper's values live in code as `PaperFigure` constants next to the
analysis that measures them, each citing the section, figure or table it comes from; nothing
here is fitted.

Verdict rule (stated once; the README's reproduction table uses it):

- `change_pct` figures (a signed relative change, e.g. Barrier vs DAG mean root latency +26 %)
  and `ratio` figures (e.g. 1.83× separate latency; compared as `ratio − 1`) are *reproduced*
  when ours has the paper's sign and its magnitude is within a factor of two of the paper's;
  *direction* when the sign matches but the size does not; *not reproduced* when the sign
  differs (a zero effect never matches a non-zero one).
- `value` figures (an absolute level, e.g. a P95 in seconds) are *reproduced* within a factor of
  two, else *differs*.
- `share` figures (a percentage of a whole: attainment, a co-batched share, roots in a band) are
  *reproduced* when both the share and its complement (100 − share) are within a factor of two
  of the paper's, else *differs*: a factor of two alone would call 57 % "reproduced" against
  100 % (43 % of roots outside where the paper has none).
- A figure with a block that has no value is *no value*: a median over the blocks that happen to
  have one would hide the gap.

Examples:
    >>> f = PaperFigure("F1", "mean root latency change (%)", 26.0, "paper setup", "§6.6")
    >>> verdict(f, 30.0), verdict(f, 80.0), verdict(f, -3.0), verdict(f, None)
    ('reproduced', 'direction', 'not reproduced', 'no value')
    >>> verdict(PaperFigure("F", "x", 1.83, "s", "G.3", kind="ratio"), 1.5)
    'reproduced'
    >>> share = PaperFigure("F", "attainment (%)", 100.0, "s", "C.2", kind="share")
    >>> verdict(share, 100.0), verdict(share, 57.35), verdict(share, 99.0)
    ('reproduced', 'differs', 'differs')
    >>> verdict(PaperFigure("F", "share (%)", 91.5, "s", "G.3", kind="share"), 86.7)
    'reproduced'
    >>> row = paper_row(f, "our setup", [20.0, 25.0, 40.0])
    >>> row["measured"], row["measured_range"], row["verdict"]
    (25.0, '20–40', 'reproduced')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from maserve_prefect.bench.replay import block_figures as bf
from maserve_prefect.bench.replay.block_figures import Row

FigureKind = Literal["change_pct", "ratio", "value", "share"]

VERDICTS = ("reproduced", "direction", "not reproduced", "differs", "no value")
"""Every verdict `verdict` can give."""

PAPER_COLUMNS = (
    "finding",
    "figure",
    "paper",
    "paper_setup",
    "our_setup",
    "measured",
    "measured_range",
    "blocks",
    "verdict",
    "source",
)
"""Column order of a paper row (`paper_row`)."""


@dataclass(frozen=True, slots=True)
class PaperFigure:
    """One figure the paper states, with its setup.

    Attributes:
        finding: which finding it belongs to (e.g. "F1 Barrier vs DAG").
        figure: what is measured, with its unit (e.g. "mean root latency change (%)").
        value: the paper's value in that unit.
        setup: the paper's setup in a line (model/device, workload, roots × blocks, limits).
        source: where the paper states it (section, figure or table).
        kind: how ours is compared with it (`verdict`).
    """

    finding: str
    figure: str
    value: float
    setup: str
    source: str
    kind: FigureKind = "change_pct"


def _effect(fig: PaperFigure, x: float) -> float:
    return x - 1.0 if fig.kind == "ratio" else x


def _within_two(paper: float, ours: float) -> bool:
    """`ours` within a factor of two of `paper` (a zero matches only a zero)."""
    if paper == 0.0 or ours == 0.0:
        return paper == ours
    return 0.5 <= ours / paper <= 2.0


def verdict(fig: PaperFigure, measured: float | None) -> str:
    """The verdict for our median `measured` against `fig` (module docstring's rule)."""
    if measured is None or math.isnan(measured):
        return "no value"
    if fig.kind == "share":
        pairs = ((fig.value, measured), (100.0 - fig.value, 100.0 - measured))
        return "reproduced" if all(_within_two(a, b) for a, b in pairs) else "differs"
    if fig.kind == "value":
        return "reproduced" if _within_two(fig.value, measured) else "differs"
    paper, ours = _effect(fig, fig.value), _effect(fig, measured)
    if paper == 0.0 or ours == 0.0 or (paper > 0) != (ours > 0):
        return "not reproduced"
    size = abs(ours) / abs(paper)
    return "reproduced" if 0.5 <= size <= 2.0 else "direction"


def paper_row(fig: PaperFigure, our_setup: str, per_block: Sequence[float | None]) -> Row:
    """A table row: the paper's figure and setup, ours (median and range across blocks), verdict."""
    row: Row = {
        "finding": fig.finding,
        "figure": fig.figure,
        "paper": fig.value,
        "paper_setup": fig.setup,
        "our_setup": our_setup,
    }
    measured = bf.put(row, "measured", per_block)
    row["blocks"] = len(per_block)
    row["verdict"] = verdict(fig, measured)
    row["source"] = fig.source
    return {k: row[k] for k in PAPER_COLUMNS}
