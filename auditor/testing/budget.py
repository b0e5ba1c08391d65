"""One open budget: the sync sites counted while it was open, and what counts against it."""

from __future__ import annotations

from dataclasses import dataclass, field

from loopaudit.profiling.in_script.report import SiteRecord, describe_site
from loopaudit.scan.suppression import suppressions


def _allows_syncs(codes: frozenset[str]) -> bool:
    """Does a line's suppression cover LA601 or the static sync rules (LA1xx), as the scan reads it
    (a code or a prefix of one: `LA1`, `LA`, a bare `# noqa`)?"""
    return any(
        code == "*" or "LA601".startswith(code) or "LA1".startswith(code) or code.startswith("LA1") for code in codes
    )


@dataclass
class Budget:
    """What one `sync_budget` counted: each site's calls are in its record's `pending`."""

    allowed: int
    sites: dict[tuple[str, str, int, str | None], SiteRecord] = field(default_factory=dict)

    @property
    def syncs(self) -> list[SiteRecord]:
        """The sites that count: suppressed lines left out, most calls first."""
        lines: dict[str, dict[int, frozenset[str]]] = {}
        kept = []
        for record in self.sites.values():
            if record.file not in lines:
                lines[record.file] = _suppressions_of(record.file)
            if _allows_syncs(lines[record.file].get(record.line, frozenset())):
                continue
            kept.append(record)
        return sorted(kept, key=lambda record: (-record.pending, record.file, record.line))

    @property
    def count(self) -> int:
        return sum(record.pending for record in self.syncs)

    def report(self) -> str:
        syncs = self.syncs
        lines = [
            f"{self.count} host-GPU sync{'s' if self.count != 1 else ''} where {self.allowed} "
            f"{'is' if self.allowed == 1 else 'are'} allowed:"
        ]
        for record in syncs:
            via = f" via {record.via}" if record.via else ""
            lines.append(
                f"  {record.file}:{record.line}  {describe_site(record.kind, record.call)}{via}  ×{record.pending}"
            )
        return "\n".join(lines)


def _suppressions_of(path: str) -> dict[int, frozenset[str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            return suppressions(stream.read())
    except OSError:
        return {}
