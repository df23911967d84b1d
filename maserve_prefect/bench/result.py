"""The one result of a suite run of any kind: its tables, its JSON, its markdown, its artifacts.

One idea: whatever the kind, a run ends as a `SuiteResult` — the parsed suite, the scale, the
kind's `Report` (`bench.report`: named tables of rows, a JSON summary, header lines) and, for
replay and pool suites, the kind's own detailed result. Everything shown is rendered from the
report's rows: `to_json()` (what `--out` writes as `<suite>.json`), `markdown()` (`<suite>.md`,
one `metrics.report.markdown_table` per table) and `publish()` (one Prefect table artifact per
table plus one markdown report, `metrics.report.publish_artifacts`, keys
`maserve-suite-<name>-*`).

JSON layout, every kind:

    {"suite": name, "kind": kind, "scale": scale, "flow_run_id": id or null,
     ...the kind's summary (replay: deadlines_s, passed, work_ok; pool: scale_config, goals,
        per_run, lower_bound_s, wall_seconds; hear: experiment),
     "tables": {table name: [row, ...]}}

Non-finite numbers are written as null.

Examples:
    >>> from maserve_prefect.bench.report import Report, Table
    >>> from maserve_prefect.bench.suite import parse_suite
    >>> suite = parse_suite({"name": "s", "scenarios": ["a.yaml"]})
    >>> res = SuiteResult(suite, "demo", Report({"arms": Table([{"arm": "dag", "p50_s": 1.5}])}))
    >>> res.to_json()
    {'suite': 's', 'kind': 'replay', 'scale': 'demo', 'flow_run_id': None, 'tables': {'arms': [{'arm': 'dag', 'p50_s': 1.5}]}}
    >>> print(res.markdown())
    ## suite s (demo)
    <BLANKLINE>
    ### arms
    <BLANKLINE>
    | arm | p50_s |
    |---|---|
    | dag | 1.5 |
    <BLANKLINE>
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

from maserve_prefect.bench.pool.results import PoolSuiteResult
from maserve_prefect.bench.replay.suite import ReplaySuiteResult
from maserve_prefect.bench.report import Report, Row, jsonable
from maserve_prefect.bench.suite import Suite
from maserve_prefect.metrics.report import markdown_table, publish_artifacts


@dataclass(slots=True)
class SuiteResult:
    """A suite run of any kind.

    Attributes:
        suite: the parsed suite; `scale`: the scale it ran at.
        report: the kind's tables, JSON summary and header (`bench.report.Report`).
        detail: the replay or pool suite's own result (None for HEAR suites, whose report is
            all there is).
        flow_run_id: the `maserve-suite` flow run (None without Prefect).
        files: every file the run wrote (side files of the run, then `write`'s).
        stem: the name its files and artifacts go by (None: the suite's name; a HEAR SCBench
            calibration sweep is `<suite>.calibration`, so it never overwrites the arms').
    """

    suite: Suite
    scale: str
    report: Report
    detail: ReplaySuiteResult | PoolSuiteResult | None = None
    flow_run_id: str | None = None
    files: list[Path] = field(default_factory=list)
    stem: str | None = None

    @property
    def file_stem(self) -> str:
        return self.stem if self.stem is not None else self.suite.name

    def tables(self) -> dict[str, list[Row]]:
        """Table name → rows (every column), in report order."""
        return self.report.rows()

    @property
    def passed(self) -> bool:
        """False when the run failed an audit (a replay arm's conformance)."""
        return self.report.passed

    def to_json(self) -> dict[str, Any]:
        """The JSON document (module docstring); no traces, no Python objects."""
        head: dict[str, Any] = {
            "suite": self.suite.name,
            "kind": self.suite.kind,
            "scale": self.scale,
            "flow_run_id": self.flow_run_id,
        }
        return jsonable(head | self.report.summary | {"tables": self.tables()})

    def header(self) -> str:
        """The markdown above the tables: suite, scale, description and the kind's lines."""
        lines = [f"## suite {self.suite.name} ({self.scale})", self.suite.description]
        return "\n\n".join(line for line in [*lines, *self.report.header] if line)

    def markdown(self) -> str:
        """The whole report: the header, then each table under its title (shown columns)."""
        parts = [self.header()]
        for name, t in self.report.tables.items():
            parts.append(f"### {t.title or name}\n\n{markdown_table(t.shown()) or '(no rows)'}")
        return "\n\n".join(parts) + "\n"

    def write(self, out: Path) -> list[Path]:
        """Write `<out>/<stem>.json` and `<out>/<stem>.md`; returns both paths (also added to
        `files`)."""
        out.mkdir(parents=True, exist_ok=True)
        js, md = out / f"{self.file_stem}.json", out / f"{self.file_stem}.md"
        js.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        md.write_text(self.markdown())
        self.files += [js, md]
        return [js, md]

    def publish(self) -> list[UUID]:
        """Publish every table and one markdown report as Prefect artifacts (a no-op outside a
        flow or task run)."""
        return publish_artifacts(
            self.tables(), self.header(), prefix=f"maserve-suite-{self.file_stem}"
        )
