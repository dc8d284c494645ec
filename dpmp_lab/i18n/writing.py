"""Translations put back into a notebook's cells, and the proof that a translated code cell runs
the code the English one runs (`differs`).

A string that spanned lines in the English is cut again into pieces on lines of their own, at
about the English's width (a wide character counts twice), never inside a replacement field or
a hint tag; a docstring keeps the indentation of the code around it.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from collections.abc import Callable

from dpmp_lab.i18n.units import (
    HINT_TAG,
    Piece,
    as_python,
    fields,
    shown_strings,
    template,
    template_parts,
)


def _string_literal(original: str, text: str, is_fstring: bool, indent: str) -> str:
    """`text` written as a Python literal the way the original was: its prefix and quotes; a
    string that spanned lines is cut into pieces on lines of their own, as it was."""
    match = re.match(r"(?i)([rbuf]*)('''|\"\"\"|'|\")", original)
    prefix, quote = (match.group(1), match.group(2)) if match else ("", '"')
    prefix = prefix.replace("r", "").replace("R", "")   # written escaped instead
    if is_fstring and "f" not in prefix.lower():
        prefix += "f"

    def escape(s: str) -> str:
        s = s.replace("\\", "\\\\")
        if len(quote) == 1:
            return s.replace("\n", "\\n").replace(quote, "\\" + quote)
        # triple quotes: only a run of three, or one at the very end, would close the string
        s = s.replace(quote, "\\" + quote[0] * 3)
        return s[:-1] + "\\" + s[-1] if s.endswith(quote[0]) else s

    if len(quote) == 3:   # a docstring: its lines indented as the code around it
        text = text.replace("\n", "\n" + indent).replace("\n" + indent + "\n", "\n\n")
        ending = "\n" + indent if original.endswith("\n" + indent + quote) else ""
        return prefix + quote + _escaped_fields(text, escape, is_fstring) + ending + quote
    if "\n" not in original or len(text) <= 40:
        return prefix + quote + _escaped_fields(text, escape, is_fstring) + quote
    second = original.split("\n")[1]
    indent = second[:len(second) - len(second.lstrip())]
    chunks = _chunks(text, max(40, 96 - len(indent)))
    joint = " \\\n" if re.search(r"\\[ \t]*\n", original) else "\n"   # a continued line
    pieces_ = [prefix + quote + _escaped_fields(c, escape, is_fstring) + quote for c in chunks]
    return (joint + indent).join(pieces_)


def _escaped_fields(text: str, escape: Callable[[str], str], is_fstring: bool) -> str:
    """Escape the text of a template but not its replacement fields' expressions."""
    if not is_fstring:
        return escape(text)
    return "".join(part if field else escape(part) for field, part in template_parts(text))


def _columns(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _chunks(text: str, width: int) -> list[str]:
    """`text` cut into pieces of about `width` columns (a wide character takes two), never
    inside a replacement field or a hint tag, preferring a cut after punctuation or a space."""
    protected, at = [], 0
    for field, part in template_parts(text):
        if field:
            protected.append((at, at + len(part)))
        at += len(part)
    protected += [(m.start(), m.end()) for m in HINT_TAG.finditer(text)]
    out, start = [], 0
    while _columns(text[start:]) > width:
        end = start
        while _columns(text[start:end + 1]) <= width:
            end += 1
        cut = end
        for good in range(end, start + (end - start) // 2, -1):
            if text[good - 1] in "、。，．,. ）)」:：" and not any(a < good < b for a, b in protected):
                cut = good
                break
        while any(a < cut < b for a, b in protected):
            cut = next(b for a, b in protected if a < cut < b)
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return [c for c in out if c]


def put_back(source: str, found: list[Piece], translate: Callable[[Piece], str | None]) -> str:
    """`source` with each piece replaced by its translation (None: kept as it is)."""
    out, last = [], 0
    for piece in sorted(found, key=lambda p: p.start):
        new = translate(piece)
        if new is None or new == piece.text:
            continue
        out.append(source[last:piece.start])
        original = source[piece.start:piece.end]
        if piece.kind == "string":
            line = source[source.rfind("\n", 0, piece.start) + 1:]
            new = _string_literal(original, new, piece.fstring,
                                  line[:len(line) - len(line.lstrip())])
        out.append(new)
        last = piece.end
    out.append(source[last:])
    return "".join(out)


def _strings(tree: ast.AST) -> list[ast.AST]:
    inside = {id(n) for j in ast.walk(tree) if isinstance(j, ast.JoinedStr)
              for n in ast.walk(j) if n is not j}
    return [n for n in ast.walk(tree) if id(n) not in inside and (
        isinstance(n, ast.JoinedStr) or isinstance(n, ast.Constant) and isinstance(n.value, str))]


def _blank_strings(tree: ast.AST) -> str:
    class Blank(ast.NodeTransformer):
        def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
            return ast.Constant("")

        def visit_Constant(self, node: ast.Constant) -> ast.AST:
            return ast.Constant("") if isinstance(node.value, str) else node

    return ast.dump(Blank().visit(tree))


def differs(english: str, translated: str) -> str | None:
    """Why `translated` does not run as `english` does (None: it does): another syntax tree
    once strings are set aside, a string that is data (not one a learner reads) changed, or an
    f-string with other replacement fields."""
    try:
        one, two = ast.parse(as_python(english)), ast.parse(as_python(translated))
    except SyntaxError as error:
        return None if english == translated else f"not Python: {error}"
    shown = {id(n) for n in shown_strings(one)}
    strings_one, strings_two = _strings(one), _strings(two)
    if _blank_strings(one) != _blank_strings(two) or len(strings_one) != len(strings_two):
        return "the code differs, not only its text"
    for a, b in zip(strings_one, strings_two, strict=True):
        if id(a) not in shown and template(a) != template(b):
            return f"the string {template(a)!r} is data and must stay as it is"
        if id(a) in shown and sorted(fields(template(a))) != sorted(fields(template(b))):
            return f"{template(b)!r} has other replacement fields than {template(a)!r}"
    return None


__all__ = ["differs", "put_back"]
