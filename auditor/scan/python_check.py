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
import warnings
from dataclasses import dataclass

# The interpreter's default, which the parser's and compiler's nesting limits derive from. The engine
# raises the limit for its own deep recursion; the check must see what a plain `python` run sees.
_DEFAULT_RECURSION_LIMIT = 1000


@dataclass(frozen=True)
class Refusal:
    """Where and why CPython refuses the file, and whether for its size or nesting (a limit) rather
    than its grammar."""

    line: int
    column: int
    reason: str
    limit: bool


def python_refusal(text: str) -> Refusal | None:
    """What running the file would meet first: CPython's compile() error, or None when it compiles."""
    return _refusal(lambda: compile(text, "<scanned>", "exec", dont_inherit=True))


def too_complex_for_python(text: str) -> Refusal | None:
    """CPython's refusal when its parser cannot take the text for its size or nesting, else None."""
    if python_refusal(text) is None:
        return None
    # compile() failed: ask the parser alone, since the compiler also rejects what ast accepts
    # (`return` outside a function, 21 nested loops), which the analysis reads fine; and a grammar
    # error is not the interpreter's to judge (see above).
    refusal = _refusal(lambda: ast.parse(text))
    if refusal is not None and not refusal.limit:
        # A grammar error stops CPython before it meets a line past its limits further on (an
        # indentation error after `x = y[0][0]...` 20,000 times): libcst would still parse that line,
        # for minutes. Long lines are asked on their own.
        return _overlong_line(text)
    return refusal


# Lines shorter than this cannot hold enough nesting to trouble libcst (CPython's limits start at 200
# nested brackets and some 1,000 levels of anything else, each at least two characters).
_LONG_LINE = 2_000


def _overlong_line(text: str) -> Refusal | None:
    """The first long line that CPython, parsing it alone, refuses for its size or nesting."""
    for number, line in enumerate(text.splitlines(), start=1):
        if len(line) < _LONG_LINE:
            continue
        refusal = _refusal(lambda line=line: ast.parse(line.strip()))
        if refusal is not None and refusal.limit:
            return Refusal(number, 1, refusal.reason, True)
    return None


def _refusal(parse) -> Refusal | None:
    """`parse()`'s error as a Refusal, run with Python's default recursion limit; None if it passes."""
    # The compiler also warns about the user's code (`x is not ""`): that is not ours to print.
    with _default_recursion_limit(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            parse()
        except SyntaxError as error:
            return Refusal(error.lineno or 1, error.offset or 1, error.msg, _a_limit(error.msg))
        except RecursionError as error:
            return Refusal(1, 1, f"it nests too deeply for Python's parser ({error})", True)
        except MemoryError:
            return Refusal(1, 1, "it nests too deeply for Python's parser (its stack overflowed)", True)
        except ValueError as error:  # NUL bytes are caught before; anything else the parser refuses
            return Refusal(1, 1, str(error), True)
    return None


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
