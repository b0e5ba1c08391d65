"""What a scan reports: one finding per rule, file and line, or per problem that spans several lines
(rule.Group: the finding's `related` places)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

RULE_DOCS_URL = "https://github.com/loopaudit/loopaudit/blob/main/docs/rules.md#{anchor}"


def rule_url(code: str, name: str) -> str:
    """Where the rule's documentation lives: its section of docs/rules.md (GitHub's heading anchor)."""
    return RULE_DOCS_URL.format(anchor=f"{code.lower()}-{name}")


@dataclass(frozen=True, order=True)
class Location:
    row: int  # 1-based, like every editor
    column: int  # 1-based, like ruff's JSON


def cell_place(filename: str, cell: int | None, location: Location) -> str:
    inside = f"cell {cell}:" if cell is not None else ""
    return f"{filename}:{inside}{location.row}:{location.column}"


@dataclass(frozen=True)
class Edit:
    """Replace the text from `start` to `end` (offsets in the decoded source) with `content`."""

    start: int
    end: int
    content: str
    location: Location
    end_location: Location


@dataclass(frozen=True)
class FixInfo:
    applicability: str  # "safe" or "unsafe", as ruff's JSON says
    message: str
    edits: tuple[Edit, ...]

    def to_json(self) -> dict:
        return {
            "applicability": self.applicability,
            "message": self.message,
            "edits": [
                {"content": e.content, "location": asdict(e.location), "end_location": asdict(e.end_location)}
                for e in self.edits
            ],
        }


@dataclass(frozen=True)
class Related:
    """Another place of a finding's one problem: "another read in this step" (rule.Group), or a line
    the problem involves (rule.Report.places)."""

    location: Location
    end_location: Location
    message: str
    source_line: str | None = None  # shown by the full format, as the finding's own
    # "member": another report of the same group, a problem place of its own ("another read in this
    # step"); "place": a line the one problem involves (where the moved tensor is built)
    kind: str = "member"
    cell: int | None = None  # in a notebook: the cell (from 1), and the location is in it

    def to_json(self) -> dict:
        data = {
            "location": asdict(self.location),
            "end_location": asdict(self.end_location),
            "message": self.message,
            "kind": self.kind,
        }
        return {"cell": self.cell, **data} if self.cell is not None else data  # a script's places keep their shape


@dataclass(frozen=True)
class Finding:
    code: str
    message: str
    filename: str
    location: Location
    end_location: Location
    severity: str = "warning"
    # Why the line runs once per step, e.g. "step loop `for x, y in train_loader` (line 42)".
    context: str | None = None
    # What to write instead; shown under the source line by the full format.
    suggestion: str | None = None
    source_line: str | None = None
    url: str | None = field(default=None)
    # Runtime findings (LA6xx) only: what was measured ({"per_step", "total", "time_ms", ...}) and
    # rule-specific facts (the live DataLoader settings, the kind of sync, the static codes there).
    observed: dict | None = None
    details: dict | None = None
    fix: FixInfo | None = None  # an automatic rewrite, for --fix (safe) or --unsafe-fixes
    # The other lines of the same problem, in line order: the other members of its group (rule.Group;
    # the finding is at the first) and the places its report named (rule.Report.places).
    related: tuple[Related, ...] = ()
    # In a notebook: the cell (numbered from 1, every cell counted, as editors count them); the
    # locations are lines of that cell. None for a Python file. JSON `cell`, as ruff's.
    cell: int | None = None

    def place(self) -> str:
        """ "train.py:12:5", or "train.ipynb:cell 3:2:5" in a notebook."""
        return cell_place(self.filename, self.cell, self.location)

    def sort_key(self) -> tuple:
        return (self.filename, self.cell or 0, self.location, self.code)

    def rows(self) -> frozenset[int]:
        """Every line the finding is about: its span and its related places' spans."""
        spans = [(self.location, self.end_location), *((r.location, r.end_location) for r in self.related)]
        return frozenset(row for start, end in spans for row in range(start.row, end.row + 1))

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("source_line")
        data["fix"] = self.fix.to_json() if self.fix else None
        for key in ("observed", "details"):
            if data[key] is None:
                data.pop(key)  # `loopaudit scan`'s JSON keeps ruff's shape
        if self.related:  # only a finding with other places has the key
            data["related"] = [place.to_json() for place in self.related]
        else:
            data.pop("related")
        return data
