"""Rewriting a call's arguments with libcst, keeping the call's own formatting: the fixes' toolbox.

Each function returns a new `cst.Call`; the engine writes it in place of the old one, so comments and
spacing inside the call stay as the user wrote them.
"""

from __future__ import annotations

import libcst as cst


def keyword_value(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def with_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `name=value`: the existing keyword's value replaced, else one more argument."""
    args = list(call.args)
    for index, arg in enumerate(args):
        if arg.keyword is not None and arg.keyword.value == name:
            args[index] = arg.with_changes(value=value)
            return call.with_changes(args=args)
    new = cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    layout = _argument_layout(call)
    if (
        isinstance(last.comma, cst.Comma)
        and isinstance(last.comma.whitespace_after, cst.ParenthesizedWhitespace)
        and layout
    ):
        # One argument per line with a trailing comma: the new argument goes on a line of its own.
        # The last argument keeps its comment; its line break now leads to the arguments' indentation,
        # and the new argument's leads to the closing parenthesis.
        closing = last.comma.whitespace_after
        args[-1] = last.with_changes(
            comma=last.comma.with_changes(
                whitespace_after=closing.with_changes(indent=layout.indent, last_line=layout.last_line)
            )
        )
        args.append(
            new.with_changes(
                comma=cst.Comma(
                    whitespace_after=closing.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
                )
            )
        )
    elif (
        not isinstance(last.comma, cst.Comma)
        and isinstance(last.whitespace_after_arg, cst.ParenthesizedWhitespace)
        and layout
    ):
        # The closing parenthesis on a line of its own, no trailing comma: the new argument goes on a
        # line of its own at the arguments' indentation, and the line break before `)` moves after it
        # (without a trailing comma, as the user wrote the call). A comment ending the last argument's
        # line stays on that line.
        closing = last.whitespace_after_arg
        args[-1] = last.with_changes(
            comma=cst.Comma(whitespace_after=layout.with_changes(first_line=closing.first_line, empty_lines=[])),
            whitespace_after_arg=cst.SimpleWhitespace(""),
        )
        args.append(new.with_changes(whitespace_after_arg=closing.with_changes(first_line=cst.TrailingWhitespace())))
    elif isinstance(last.comma, cst.Comma):  # `f(a, b,)` on one line
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(new.with_changes(comma=last.comma))
    else:
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(new)
    return call.with_changes(args=args)


def _argument_layout(call: cst.Call) -> cst.ParenthesizedWhitespace | None:
    """The line break that leads to the arguments' indentation in a call laid out one argument per
    line: after `(`, or else after an argument's comma."""
    candidates = [
        call.whitespace_before_args,
        *(arg.comma.whitespace_after for arg in call.args[:-1] if isinstance(arg.comma, cst.Comma)),
    ]
    return next((ws for ws in candidates if isinstance(ws, cst.ParenthesizedWhitespace)), None)


def without_argument(call: cst.Call, index: int) -> cst.Call:
    """`call` without its `index`-th argument; the comma before a removed last argument goes too."""
    args = list(call.args)
    removed = args.pop(index)
    if args and index == len(args):  # it was the last one
        args[-1] = args[-1].with_changes(
            comma=removed.comma if isinstance(removed.comma, cst.Comma) else cst.MaybeSentinel.DEFAULT
        )
    return call.with_changes(args=args)


def with_first_argument(call: cst.Call, value: cst.BaseExpression) -> cst.Call:
    """`call` with `value` as a new first positional argument."""
    if not call.args:
        return call.with_changes(args=[cst.Arg(value=value)])
    opening = call.whitespace_before_args
    # One argument per line: the new one gets its own line too.
    after = (
        opening.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
        if isinstance(opening, cst.ParenthesizedWhitespace)
        else cst.SimpleWhitespace(" ")
    )
    return call.with_changes(args=[cst.Arg(value=value, comma=cst.Comma(whitespace_after=after)), *call.args])


TRUE = cst.Name("True")


def is_true(expr: cst.BaseExpression | None) -> bool:
    """Is it the literal `True` (a keyword's value, as `keyword_value` gives it)?"""
    return isinstance(expr, cst.Name) and expr.value == "True"
