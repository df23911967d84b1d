"""The seeded script that wrote `data/meeting_summary.jsonl`: synthetic meeting transcripts.

Each meeting has 4–6 attendees, four agenda items drawn from `TOPICS`, and per item an
opening, a discussion (topic lines mixed with generic remarks, ~45 utterances), a risk raised by
one attendee and a decision with a value, an owner and a due date. The query asks about one
agenda item; its reference key points are that item's decision value, owner, due date and risk.
Transcripts run to a few thousand tokens.

Every choice comes from `derive_seed` (SHA-256 of the meeting seed and the choice's purpose), not
from a library RNG stream, so the output is byte-identical on every Python / numpy version; the
tests regenerate the file and compare. Regenerate with
`python -m maserve_prefect.bindings.meeting_gen`.

Examples:
    >>> first = generate(num_meetings=1)[0]
    >>> sorted(first)[:3]
    ['agenda', 'attendees', 'id']
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from maserve_prefect.bindings.content import derive_seed

T = TypeVar("T")

SEED = 20261129
NUM_MEETINGS = 22
DATA_FILE = Path(__file__).parent / "data" / "meeting_summary.jsonl"

NAMES = (
    "Alice Moreau", "Bashir Rahimi", "Chen Wei", "Dana Kowalski", "Emeka Obi", "Farah Haddad",
    "Gustavo Lima", "Hana Sato", "Ivan Petrov", "Jo Lindqvist", "Kwame Mensah", "Lucia Romano",
)  # fmt: skip
TEAMS = ("Platform", "Payments", "Mobile", "Data", "Support Tools", "Search", "Growth", "Infra")
MONTHS = ("March", "April", "May", "June", "July", "September", "October", "November")

# topic: (agenda title, decision template with {v}, values, risk term, topic remarks)
TOPICS: dict[str, tuple[str, str, tuple[str, ...], str, tuple[str, ...]]] = {
    "retention": ("log retention policy", "keep application logs for {v} days", ("30", "45", "60", "90"), "storage cost",
                  ("audit asked how long we keep request logs", "legal wants the retention window written down",
                   "older logs are rarely read after the first month", "we could tier old logs to cold storage")),
    "hiring": ("hiring plan for next quarter", "open {v} engineering positions", ("two", "three", "four", "five"), "onboarding load",
               ("the backlog keeps growing faster than we close it", "interview loops take most of a week",
                "we lost one senior engineer last month", "a contractor could cover the gap short term")),
    "oncall": ("on-call rotation", "move to a {v}-person weekly rotation", ("four", "five", "six", "seven"), "burnout",
               ("pages at night doubled since the last release", "the handover notes are often incomplete",
                "secondary on-call is rarely paged", "alert thresholds may be too sensitive")),
    "budget": ("cloud budget", "cap monthly cloud spend at {v} thousand dollars", ("40", "55", "70", "85"), "overrun",
               ("spend rose after the new cluster came online", "reserved instances would cut the bill",
                "finance wants a forecast every month", "idle test environments run all weekend")),
    "release": ("release schedule", "ship releases every {v} weeks", ("two", "three", "four", "six"), "regressions",
                ("the last release slipped by nine days", "release notes are written at the last minute",
                 "feature flags let us ship dark", "QA needs two days of freeze")),
    "migration": ("database migration", "migrate the orders database in {v} phases", ("two", "three", "four"), "downtime",
                  ("the current version leaves support next year", "replication lag spikes during backups",
                   "we need a rollback plan for every phase", "read replicas can take the reporting load")),
    "security": ("security review", "rotate all service credentials every {v} days", ("30", "60", "90"), "leaked tokens",
                 ("a token was found in an old build log", "the scanner flags too many false positives",
                  "secrets should come from the vault only", "two services still use shared keys")),
    "latency": ("API latency", "set a p99 latency target of {v} milliseconds", ("150", "200", "250", "300"), "timeouts",
                ("p99 latency doubled during the sale", "the cache hit rate dropped to sixty percent",
                 "one slow query dominates checkout", "clients retry too aggressively")),
    "docs": ("developer documentation", "publish the API guide by the {v} sprint", ("next", "second", "third"), "stale examples",
             ("new hires struggle with the setup guide", "half the examples use the old client",
              "docs live in three different places", "we could generate references from the schema")),
    "vendor": ("analytics vendor contract", "renew the analytics contract for {v} months", ("6", "12", "18", "24"), "price increase",
               ("the vendor raised prices by twelve percent", "the export API is unreliable",
                "building in-house would take two quarters", "procurement needs a decision this month")),
    "testing": ("test coverage", "raise unit test coverage to {v} percent", ("70", "75", "80", "85"), "flaky tests",
                ("flaky tests block merges twice a week", "the payment module has almost no tests",
                 "coverage alone does not catch integration bugs", "CI takes forty minutes")),
    "offsite": ("team offsite", "hold the offsite for {v} days", ("two", "three"), "travel cost",
                ("people want more time for planning", "the venue must be booked six weeks ahead",
                 "remote members need travel support", "last year's agenda was too packed")),
}  # fmt: skip

GENERIC = (
    "I agree with the direction, but we should write down the assumptions.",
    "Can we check the numbers from last quarter before we commit?",
    "Let us keep this short, we have more items on the agenda.",
    "I can share the dashboard after the meeting.",
    "That matches what the customer team told us last week.",
    "We tried something similar two years ago and it mostly worked.",
    "I am not sure the estimate includes testing time.",
    "Let me take a note so we do not lose this.",
    "If we do this, something else has to move out of the sprint.",
    "Good point, I had not thought about the support side.",
    "We should ask the people who run it every day.",
    "Can someone summarize the trade-off in one sentence?",
)


def _pick(options: Sequence[T], *key: object) -> T:
    return options[derive_seed(SEED, *key) % len(options)]


def _sample(options: Sequence[T], k: int, *key: object) -> list[T]:
    ranked = sorted(range(len(options)), key=lambda i: derive_seed(SEED, *key, i))
    return [options[i] for i in ranked[:k]]


def _meeting(n: int) -> dict[str, Any]:
    mid = f"meet-{n:02d}"
    team = _pick(TEAMS, mid, "team")
    attendees = _sample(NAMES, 4 + derive_seed(SEED, mid, "size") % 3, mid, "people")
    agenda_keys = _sample(sorted(TOPICS), 4, mid, "agenda")
    lines: list[str] = [
        f"[{attendees[0]}] Welcome to the {team} team sync. We have four items today."
    ]
    items = []
    for a, key in enumerate(agenda_keys):
        title, decision_t, values, risk, remarks = TOPICS[key]
        value = _pick(values, mid, key, "value")
        owner = _pick(attendees[1:], mid, key, "owner")
        due = f"{_pick(MONTHS, mid, key, 'month')} {1 + derive_seed(SEED, mid, key, 'day') % 28}"
        decision = decision_t.format(v=value)
        lines.append(f"[{attendees[0]}] Item {a + 1}: the {title}.")
        for u in range(40 + derive_seed(SEED, mid, key, "len") % 12):
            speaker = _pick(attendees, mid, key, u, "speaker")
            if derive_seed(SEED, mid, key, u, "kind") % 3 == 0:
                remark = _pick(remarks, mid, key, u, "remark")
                lines.append(f"[{speaker}] On the {title}: {remark}.")
            else:
                first = _pick(GENERIC, mid, key, u, "generic")
                second = _pick(GENERIC, mid, key, u, "generic2")
                lines.append(f"[{speaker}] {first} {second if second != first else ''}".rstrip())
            if u == 6:
                raiser = _pick(attendees, mid, key, "risk")
                lines.append(
                    f"[{raiser}] My main worry with the {title} is {risk}; we should track it."
                )
        lines.append(
            f"[{attendees[0]}] Decision: we will {decision}. {owner} owns the follow-up, due {due}."
        )
        items.append(
            {
                "topic": key, "title": title, "decision": decision, "owner": owner, "due": due,
                "risk": risk, "value_term": _value_term(decision_t, value),
            }
        )  # fmt: skip
    lines.append(f"[{attendees[0]}] Thanks everyone, notes will go out today.")
    focus = items[derive_seed(SEED, mid, "focus") % len(items)]
    return {
        "id": mid,
        "team": team,
        "attendees": attendees,
        "agenda": [i["title"] for i in items],
        "transcript": "\n".join(lines),
        "query": f"What did the meeting decide about the {focus['title']}, who owns the follow-up and by when, and what risk was raised?",
        "key_points": [
            {"point": f"decision: {focus['decision']}", "terms": [focus["value_term"]]},
            {"point": f"owner: {focus['owner']}", "terms": [focus["owner"].split()[0]]},
            {"point": f"due: {focus['due']}", "terms": [focus["due"]]},
            {"point": f"risk: {focus['risk']}", "terms": [focus["risk"]]},
        ],
        "reference": (
            f"The team agreed to {focus['decision']}. {focus['owner']} owns the follow-up, due "
            f"{focus['due']}. The risk raised was {focus['risk']}."
        ),
    }


def _value_term(decision_t: str, value: str) -> str:
    # The value plus the word that follows it ("90 days", "four-person"): the number alone
    # would also match other agenda items' numbers.
    after = decision_t.split("{v}", 1)[1]
    return value + after.split()[0] if after.startswith("-") else f"{value} {after.split()[0]}"


def generate(num_meetings: int = NUM_MEETINGS) -> list[dict[str, Any]]:
    """The meetings, in id order (deterministic)."""
    return [_meeting(n) for n in range(1, num_meetings + 1)]


def render(meetings: Sequence[dict[str, Any]]) -> str:
    """The JSONL text of `meetings` (sorted keys, one per line)."""
    return "".join(json.dumps(m, sort_keys=True) + "\n" for m in meetings)


def main() -> None:
    """Write `data/meeting_summary.jsonl`."""
    DATA_FILE.write_text(render(generate()), encoding="utf-8")


if __name__ == "__main__":
    main()
