"""What CPython itself refuses to parse for its size or nesting, asked before libcst sees the text.

libcst's native parser has no guard of its own: 2,000 nested brackets or 10,000 unary minus signs
overflow its stack (a segmentation fault, not an exception), and one line of 20,000 `+` terms takes
minutes. CPython's parser stops such files with a clear error ("too many nested parentheses",
"maximum recursion depth exceeded during ast construction"): nobody can run them, so they are
syntax errors (LA001), told in Python's words, and libcst never sees them.

Only those limits are taken from CPython. Its grammar is the running interpreter's, which may be
older than the code scanned (a `match` statement, a PEP 695 `type` alias): a plain syntax error is
left for libcst to judge, as before. The check is CPython's own `compile`, about a twentieth of the
cost of libcst's parse, with Python's default recursion limit (what `python train.py` runs with).
"""

from __future__ import annotations

import ast
import contextlib
import sys
from dataclasses import dataclass

# The interpreter's default, which the parser's and compiler's nesting limits derive from. The engine
# raises the limit for its own deep recursion; the check must see what a plain `python` run sees.
_DEFAULT_RECURSION_LIMIT = 1000


@dataclass(frozen=True)
class TooComplex:
    """Where and why CPython's parser gives up on the file."""

    line: int
    column: int
    reason: str


def too_complex_for_python(text: str) -> TooComplex | None:
    """CPython's refusal when its parser cannot take the text for its size or nesting, else None."""
    with _default_recursion_limit():
        try:
            compile(text, "<scanned>", "exec", dont_inherit=True)
            return None
        except (SyntaxError, RecursionError, MemoryError, ValueError):
            pass
        # compile() failed: ask the parser alone, since the compiler also rejects what ast accepts
        # (`return` outside a function, 21 nested loops), which the analysis reads fine.
        try:
            ast.parse(text)
            return None
        except SyntaxError as error:
            if not _a_limit(error.msg):
                return None  # a grammar error: the interpreter's grammar is not the judge (see above)
            return TooComplex(error.lineno or 1, error.offset or 1, error.msg)
        except RecursionError as error:
            return TooComplex(1, 1, f"it nests too deeply for Python's parser ({error})")
        except MemoryError:
            return TooComplex(1, 1, "it nests too deeply for Python's parser (its stack overflowed)")
        except ValueError as error:  # NUL bytes are caught before; anything else the parser refuses
            return TooComplex(1, 1, str(error))


def _a_limit(message: str) -> bool:
    """CPython's errors for size and nesting rather than grammar: "too many nested parentheses",
    "too many levels of indentation", an integer literal of thousands of digits."""
    return message.startswith("too many") or "integer string conversion" in message


@contextlib.contextmanager
def _default_recursion_limit():
    """Python's default limit, counted from here: CPython's parser starts its count at the caller's
    depth, and `python train.py` parses its file with no frame on the stack."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(_DEFAULT_RECURSION_LIMIT + depth)
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)
