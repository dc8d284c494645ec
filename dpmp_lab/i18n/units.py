"""What a learner reads in a notebook, cut into the pieces a translator translates (writing.py
puts them back in another language).

A markdown cell is cut into blocks at its blank lines (a fenced code block is code: no piece, and
no cut inside it); a cell of a written answer, or the part of a code cell inside its
solution or hidden-test markers, is a secret piece (catalogue.py keeps those apart). A code
cell gives its comments, its docstrings and the strings a learner reads: what `print`,
`display`, an `assert` or a raised exception shows, and any other string that is prose (two
words or more) and not data the code compares or looks up (a dict key, a subscript, an operand
of `==` or `in`, an argument of a string method, a regular expression or a label looked up
again: _DATA_CALLS). Nothing else of a code cell is touched, so a translated code cell runs the
same tokens as the English one: `writing.differs` is what the tests ask.

An f-string is one piece, its replacement fields written as in the source (`{n}`, `{x!r}`):
a translation must keep the same fields, and every `[hint: ...]` tag, unchanged.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import tokenize
from collections.abc import Callable

# nbgrader's markers and tool directives stay as they are: something reads them
_KEPT_COMMENTS = re.compile(r"#+\s*(BEGIN|END) (SOLUTION|HIDDEN TESTS)\b|#\s*(noqa|type:|pragma)"
                            r"|#!")
_LETTERS = re.compile(r"[A-Za-z]{2,}")
_SHOWN_BY = {"print", "display", "Markdown", "HTML", "warn", "fail", "skip", "hint"}
# calls whose string arguments are data whatever they read like: patterns and text matched
# against messages, labels looked up again, keys
_DATA_CALLS = {"sub", "subn", "search", "match", "fullmatch", "findall", "finditer", "split",
               "compile", "replace", "startswith", "endswith", "find", "rfind", "index", "count",
               "strip", "lstrip", "rstrip", "removeprefix", "removesuffix", "get", "pop",
               "getattr", "hasattr", "setattr", "getenv", "mark", "at", "encode", "decode"}
_DATA_KEYWORDS = {"unit", "key", "sep", "end", "prefix", "suffix"}
_FENCE = re.compile(r"^\s*(```|~~~)")
HINT_TAG = re.compile(r"\[hint: [^\]]+\]")


@dataclasses.dataclass(frozen=True)
class Piece:
    """One text to translate: `text` as the catalogue's msgid, at [start, end) of the cell's
    source; `kind` is markdown, comment or string (docstrings are strings)."""
    kind: str
    text: str
    start: int
    end: int
    fstring: bool = False   # a string whose text is a template: written back as an f-string


# --- markdown -------------------------------------------------------------------------------

def markdown_pieces(source: str) -> list[Piece]:
    """The blocks of a markdown cell between blank lines, a fenced block whole; a block without
    a word (a rule, a formula alone) is not a piece."""
    pieces, start, fenced, offset = [], None, False, 0
    lines = source.splitlines(keepends=True)
    for line in lines + [""]:
        blank = not line.strip() and not fenced
        if _FENCE.match(line):
            fenced = not fenced
        if line and not blank and start is None:
            start = offset
        if (blank or not line) and start is not None:
            end = offset
            while end > start and source[end - 1] == "\n":
                end -= 1
            text = source[start:end]
            if _LETTERS.search(_without_code(text)):
                pieces.append(Piece("markdown", text, start, end))
            start = None
        offset += len(line)
    return pieces


def _without_code(text: str) -> str:
    return re.sub(r"`[^`]*`|\$[^$]*\$", "", text)


# --- code -----------------------------------------------------------------------------------

def as_python(source: str) -> str:
    """The source with IPython's magic and shell lines blanked (same offsets), so that ast
    reads the Python in it (a %%cell magic's body is Python too)."""
    return "".join(" " * (len(line) - len(line.rstrip("\r\n"))) + line[len(line.rstrip("\r\n")):]
                   if line.lstrip().startswith(("%", "!")) else line
                   for line in source.splitlines(keepends=True))


def _offsets(source: str) -> Callable[[int, int], int]:
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def at(line: int, col: int) -> int:   # ast's col is in UTF-8 bytes
        text = source[starts[line - 1]:starts[line] if line < len(starts) else len(source)]
        return starts[line - 1] + len(text.encode()[:col].decode())
    return at


def comment_pieces(source: str) -> list[Piece]:
    at = _offsets(source)
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(as_python(source)).readline):
            if tok.type != tokenize.COMMENT or _KEPT_COMMENTS.match(tok.string):
                continue
            text = tok.string.lstrip("#").strip()
            if _LETTERS.search(text):
                start = at(*tok.start)
                lead = len(tok.string) - len(tok.string.lstrip("#").lstrip())
                out.append(Piece("comment", text, start + lead, start + len(tok.string)))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    return out


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _called(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _read_by_learner(node: ast.AST, parents: dict[int, ast.AST], prose: bool) -> bool:
    """Whether the string `node` is shown to a learner rather than used as data."""
    child, parent = node, parents.get(id(node))
    while parent is not None:
        if (isinstance(parent, ast.Dict) and any(k is child for k in parent.keys)
                or isinstance(parent, ast.DictComp) and parent.key is child):
            return False
        if isinstance(parent, ast.Subscript) and parent.slice is child:
            return False
        if isinstance(parent, ast.Compare):
            return False
        if isinstance(parent, ast.Assert):
            return parent.msg is child
        if isinstance(parent, ast.Raise):
            return True
        if isinstance(parent, ast.Call) and child is not parent.func:
            name = _called(parent.func)
            if name in _DATA_CALLS or (isinstance(child, ast.keyword)
                                       and child.arg in _DATA_KEYWORDS):
                return False
            if name in _SHOWN_BY or name.endswith(("Error", "Exception", "Warning")):
                return True
            if not prose:
                return False
        if isinstance(parent, ast.JoinedStr):
            return False          # a string inside an f-string's field: the f-string decides
        if isinstance(parent, (ast.stmt, ast.Lambda)):
            break
        child, parent = parent, parents.get(id(parent))
    return prose


def _is_docstring(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    expr = parents.get(id(node))
    owner = parents.get(id(expr)) if isinstance(expr, ast.Expr) else None
    return (isinstance(owner, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and owner.body and owner.body[0] is expr)


def template(node: ast.JoinedStr | ast.Constant) -> str:
    """A string as its msgid: a constant's value; an f-string's literal text with each
    replacement field written `{expression!conversion:spec}` (literal braces doubled)."""
    if isinstance(node, ast.Constant):
        return node.value
    out = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            out.append(part.value.replace("{", "{{").replace("}", "}}"))
        else:
            conv = "" if part.conversion == -1 else "!" + chr(part.conversion)
            spec = "" if part.format_spec is None else ":" + template(part.format_spec)
            out.append("{" + ast.unparse(part.value) + conv + spec + "}")
    return "".join(out)


def _is_prose(text: str) -> bool:
    """Two words or more, apart: what a learner reads rather than a name or a key."""
    return len(_LETTERS.findall(text)) >= 2 and bool(re.search(r"\s", text.strip()))


def _literal_text(node: ast.JoinedStr | ast.Constant) -> str:
    if isinstance(node, ast.Constant):
        return node.value
    return "".join(p.value for p in node.values if isinstance(p, ast.Constant))


def shown_strings(tree: ast.AST) -> list[ast.JoinedStr | ast.Constant]:
    """The string nodes of `tree` a learner reads (see the module's docstring)."""
    parents, out = _parents(tree), []
    inside_fstring = {id(n) for j in ast.walk(tree) if isinstance(j, ast.JoinedStr)
                      for n in ast.walk(j) if n is not j}
    # a value the cell compares or looks up somewhere is data wherever it is written (a
    # message appended to a list and later compared with that same text)
    compared = {template(n) for n in ast.walk(tree) if id(n) not in inside_fstring
                and (isinstance(n, ast.JoinedStr)
                     or isinstance(n, ast.Constant) and isinstance(n.value, str))
                and not _read_by_learner(n, parents, True) and not _is_docstring(n, parents)}
    for node in ast.walk(tree):
        if id(node) in inside_fstring:
            continue
        if not (isinstance(node, ast.JoinedStr)
                or isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        literal = _literal_text(node)
        if not _LETTERS.search(literal) or template(node) in compared:
            continue
        if (_is_docstring(node, parents)
                or _read_by_learner(node, parents, _is_prose(literal))):
            out.append(node)
    return out


def string_pieces(source: str) -> list[Piece]:
    try:
        tree = ast.parse(as_python(source))
    except SyntaxError:
        return []
    at = _offsets(source)
    out = []
    for node in shown_strings(tree):
        start, end = at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)
        text = template(node)
        if re.match(r"(?i)[rbuf]*('\'\'|\"\"\")", source[start:end]):
            text = inspect.cleandoc(text)   # a docstring's indentation is the code's
        out.append(Piece("string", text, start, end, isinstance(node, ast.JoinedStr)))
    return sorted(out, key=lambda p: p.start)


def code_pieces(source: str) -> list[Piece]:
    strings = string_pieces(source)
    # a comment never lies inside a string, but tokenize and ast disagree on nothing else
    comments = [c for c in comment_pieces(source)
                if not any(s.start <= c.start < s.end for s in strings)]
    return sorted(strings + comments, key=lambda p: p.start)


def pieces(cell_type: str, source: str) -> list[Piece]:
    if cell_type == "markdown":
        return markdown_pieces(source)
    if cell_type == "code":
        return code_pieces(source)
    return []


def template_parts(text: str) -> list[tuple[bool, str]]:
    """An f-string template cut into (is a replacement field, text) parts; a field may hold
    braces of its own (a nested f-string), doubled braces outside one are text."""
    parts: list[tuple[bool, str]] = []
    i, start, depth = 0, 0, 0
    while i < len(text):
        if depth == 0 and text.startswith(("{{", "}}"), i):
            i += 2
            continue
        if text[i] == "{":
            if depth == 0:
                parts.append((False, text[start:i]))
                start = i
            depth += 1
        elif text[i] == "}" and depth:
            depth -= 1
            if depth == 0:
                parts.append((True, text[start:i + 1]))
                start = i + 1
        i += 1
    parts.append((False, text[start:]))
    return [(field, part) for field, part in parts if part]


def fields(text: str) -> list[str]:
    """The replacement fields of an f-string template, in order."""
    return [part for field, part in template_parts(text) if field]


def hint_tags(text: str) -> list[str]:
    return sorted(HINT_TAG.findall(text))


__all__ = ["HINT_TAG", "Piece", "as_python", "code_pieces", "comment_pieces", "fields",
           "hint_tags", "markdown_pieces", "pieces", "shown_strings", "string_pieces", "template",
           "template_parts"]
