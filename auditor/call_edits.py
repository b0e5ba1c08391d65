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
    new = cst.Arg(value=value, keyword=cst.Name(name), equal=cst.AssignEqual(
        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):
        # A trailing comma (usually one argument per line): the new argument takes the last one's
        # place in the layout, and the last one gets the separator the others use.
        separator = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))
        args[-1] = last.with_changes(comma=separator)
        args.append(new.with_changes(comma=last.comma))
    else:
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(new)
    return call.with_changes(args=args)


def without_argument(call: cst.Call, index: int) -> cst.Call:
    """`call` without its `index`-th argument; the comma before a removed last argument goes too."""
    args = list(call.args)
    removed = args.pop(index)
    if args and index == len(args):  # it was the last one
        args[-1] = args[-1].with_changes(comma=removed.comma if isinstance(removed.comma, cst.Comma) else cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=args)


def with_first_argument(call: cst.Call, value: cst.BaseExpression) -> cst.Call:
    """`call` with `value` as a new first positional argument."""
    first = cst.Arg(value=value, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if call.args else cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=[first, *call.args])


TRUE = cst.Name("True")
