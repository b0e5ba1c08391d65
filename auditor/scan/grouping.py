"""One problem, one finding: a rule's reports that say they are one problem (rule.Group) become one
finding at the earliest line, the others its related places.

Four `.item()` reads in one step are one sync problem, fixed together by stacking the values and
reading them once; four findings would make the user read the same advice four times, and a fix of
one of them would leave the step as slow as before. The finding's message says how many places
there are and where, so that every format, down to one line of text, carries them.

The findings come in already suppressed line by line (a `# noqa: LA101` on a read drops that read
only), so a group holds the lines that are still reported, and the finding is at the first of them.
Its fingerprint is that line's (fingerprint.py): adding a read later in the step keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from loopaudit.findings.finding import Finding, Related
from loopaudit.rule_api.rule import Group


def one_finding_per_problem(found: Iterable[tuple[Finding, Group | None]]) -> list[Finding]:
    """The findings, those of each (code, group key) merged into the first, in no particular order."""
    alone: list[Finding] = []
    groups: dict[tuple, list[tuple[Finding, Group]]] = {}
    for finding, group in found:
        if group is None:
            alone.append(finding)
        else:
            groups.setdefault((finding.code, group.key), []).append((finding, group))
    for members in groups.values():
        members.sort(key=lambda member: member[0].location)
        (first, group), others = members[0], [finding for finding, _ in members[1:]]
        alone.append(_merged(first, group, others) if others else first)
    return alone


def _merged(first: Finding, group: Group, others: list[Finding]) -> Finding:
    related = (
        first.related
        + tuple(
            Related(f.location, f.end_location, f"another {group.noun} {group.where}", f.source_line) for f in others
        )
        + tuple(place for f in others for place in f.related)
    )
    return replace(
        first,
        message=first.message + _summary(group, [f.location.row for f in others]),
        related=tuple(sorted(related, key=lambda place: place.location)),
    )


def _summary(group: Group, rows: list[int]) -> str:
    """ "; and 3 more reads in this step, lines 58, 61, 64: stack them and read once"."""
    many = len(rows) > 1
    noun = f"{group.noun}s" if many else group.noun
    lines = f"line{'s' if many else ''} {', '.join(map(str, rows))}"
    return f"; and {len(rows)} more {noun} {group.where}, {lines}: {group.advice}"
