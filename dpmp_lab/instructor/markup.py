"""What a learner's markup may keep in a page an instructor or a learner opens: HTML cleaned
with a strict allowlist, SVG pictures cleaned as XML, markdown judged by the page's own
renderer, links and pictures by the scheme a browser would read. Strings in, strings out;
inert.py applies it to a graded notebook.

- HTML (bleach): tables, text markup, http(s) and mailto links, and style attributes with
  colours, spacing and alignment only; every other tag is escaped (so the page shows a
  script's code as text), every other attribute dropped (events, ids, classes, sources).
- SVG: the shapes, text, gradients and markers of a picture, their geometry and paint, and
  references within the picture (`url(#id)`); scripts, events, links, styles, images and
  foreign content go, and so does a document with a DTD.
- markdown: inert when nbconvert's renderer passes no raw HTML through and every link is
  http(s), mailto or a #fragment and every picture http(s) or a PNG, JPEG or GIF data URL.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from typing import Any
from xml.etree import ElementTree

import bleach
import tinycss2
from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring as parse_xml
from nbconvert.filters.markdown_mistune import InvalidNotebook, IPythonRenderer, MarkdownWithMath

HTML_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "code", "col", "colgroup", "dd", "del",
    "div", "dl", "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "kbd", "li", "ol",
    "p", "pre", "s", "samp", "small", "span", "strong", "sub", "sup", "table", "tbody", "td",
    "tfoot", "th", "thead", "tr", "u", "ul"})
HTML_ATTRIBUTES = frozenset({"title", "colspan", "rowspan", "align", "style"})
CSS_PROPERTIES = frozenset({
    "color", "background", "background-color", "font-weight", "font-style", "font-family",
    "text-align", "text-decoration", "white-space", "padding", "padding-left", "padding-right",
    "margin", "margin-left", "margin-right", "border-radius"})
CSS_FUNCTIONS = frozenset({"rgb", "rgba", "hsl", "hsla"})
CSS_TOKENS = frozenset({"whitespace", "ident", "hash", "number", "percentage", "dimension",
                        "string", "literal"})

SVG = "http://www.w3.org/2000/svg"
SVG_TAGS = frozenset(f"{{{SVG}}}{t}" for t in (
    "svg", "g", "defs", "title", "desc", "rect", "circle", "ellipse", "line", "polyline",
    "polygon", "path", "text", "tspan", "marker", "linearGradient", "radialGradient", "stop",
    "pattern", "clipPath"))
SVG_ATTRIBUTES = frozenset({
    "width", "height", "viewBox", "preserveAspectRatio", "x", "y", "x1", "y1", "x2", "y2",
    "cx", "cy", "r", "rx", "ry", "dx", "dy", "d", "points", "transform", "id", "fill",
    "fill-opacity", "fill-rule", "stroke", "stroke-width", "stroke-dasharray",
    "stroke-linecap", "stroke-linejoin", "stroke-opacity", "opacity", "font-family",
    "font-size", "font-weight", "font-style", "text-anchor", "dominant-baseline", "offset",
    "stop-color", "stop-opacity", "orient", "markerWidth", "markerHeight", "markerUnits",
    "refX", "refY", "marker-start", "marker-mid", "marker-end", "gradientUnits",
    "gradientTransform", "patternUnits", "patternTransform", "clip-path", "clipPathUnits"})
LOCAL_REFERENCE = re.compile(r"\s*url\(\s*#[\w.-]+\s*\)\s*")
# html5lib, under bleach, takes time quadratic in how many elements are open at once (8000
# nested <div>s: 6 s); a learner's output nested deeper than this is not cleaned but dropped.
MAX_DEPTH = 200
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                  "param", "source", "track", "wbr"})
URL_ATTRIBUTES = frozenset({"href", "src", "srcset", "action", "formaction", "poster",
                            "background", "data", "xlink:href"})


def _scheme(url: str) -> tuple[str | None, str]:
    """(the scheme a browser reads, lowercased, or None; the URL as it reads it): browsers drop
    spaces and control characters around a URL, and tabs and newlines within it."""
    seen = re.sub(r"[\t\n\r]", "", url).strip("".join(map(chr, range(33))))
    found = re.match(r"([a-zA-Z][a-zA-Z0-9+.\-]*):", seen)
    return (found.group(1).lower() if found else None), seen


def link_is_inert(url: str) -> bool:
    """A link a learner may put in a page: http(s), mailto or a #fragment of the page (no
    javascript:, no data:, no relative path: formgrader serves the learner's own files)."""
    scheme, seen = _scheme(url)
    return scheme in ("http", "https", "mailto") or (scheme is None and seen.startswith("#"))


def picture_is_inert(url: str) -> bool:
    """A picture a learner may show: http(s), or a PNG, JPEG or GIF data URL."""
    scheme, seen = _scheme(url)
    return scheme in ("http", "https") or bool(
        re.match(r"data:image/(png|jpeg|gif)[;,]", seen, re.IGNORECASE))


def _html_attribute(tag: str, name: str, value: str) -> bool:
    if name == "href":
        return tag == "a" and link_is_inert(value)
    return name in HTML_ATTRIBUTES


def _fetches_nothing(token: Any) -> bool:
    if token.type == "function":
        return token.lower_name in CSS_FUNCTIONS and all(map(_fetches_nothing, token.arguments))
    return token.type in CSS_TOKENS


class _Styles:
    """A style attribute's allowed properties (CSS_PROPERTIES), and of those only values made
    of colours, numbers and words: no url(), image-set() or anything else that fetches."""

    def sanitize_css(self, style: str) -> str:
        kept = [f"{d.lower_name}: {tinycss2.serialize(d.value).strip()}"
                for d in tinycss2.parse_declaration_list(style, skip_comments=True,
                                                         skip_whitespace=True)
                if d.type == "declaration" and d.lower_name in CSS_PROPERTIES
                and all(map(_fetches_nothing, d.value))]
        return "; ".join(kept)


def clean_html(fragment: str) -> str | None:
    """The HTML `fragment` with only the allowlist's tags, attributes and styles; other tags
    are escaped, so the page shows them as text (a script's code included) and runs none.
    None for a fragment nested deeper than MAX_DEPTH."""
    if _read(fragment).deepest > MAX_DEPTH:
        return None
    return bleach.clean(fragment, tags=HTML_TAGS, attributes=_html_attribute,
                        protocols={"http", "https", "mailto"}, strip=False,
                        strip_comments=True, css_sanitizer=_Styles())


def as_cleaned(text: str) -> str:
    """How clean_html writes `text` in an element: with &, < and > escaped (so a line looked
    for in HTML it cleaned is looked for in this form too)."""
    return html.escape(text, quote=False)


def clean_svg(svg: str) -> str | None:
    """The SVG picture with only the allowlist's elements and attributes (a `url(#id)` within
    the picture allowed, nothing outside it), or None when it is not a well-formed SVG
    document without a DTD."""
    try:
        root = parse_xml(svg, forbid_dtd=True)
        if root.tag != f"{{{SVG}}}svg":
            return None
        _prune(root)
    except (ElementTree.ParseError, DefusedXmlException, ValueError, RecursionError):
        return None   # RecursionError: nested deeper than Python's stack (no picture is)
    root.set("xmlns", SVG)
    return ElementTree.tostring(root, encoding="unicode")


def _prune(element: ElementTree.Element) -> None:
    """Keep the allowlist's children and attributes, and name each kept element without its
    namespace (the root declares it once)."""
    element.tag = element.tag.removeprefix(f"{{{SVG}}}")
    for child in list(element):
        if child.tag in SVG_TAGS:
            _prune(child)
        else:
            element.remove(child)
    for name, value in list(element.attrib.items()):
        if name not in SVG_ATTRIBUTES or ("url(" in value.lower()
                                          and not LOCAL_REFERENCE.fullmatch(value)):
            del element.attrib[name]


class _Reader(HTMLParser):
    """What a page would show of some HTML: its text, its attributes, and how many elements
    were open at once at most (roughly: a parser's tree may close some earlier)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.attributes: list[tuple[str, str, str]] = []
        self.deepest = 0
        self._open = 0
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.attributes += [(tag, name, value or "") for name, value in attrs]
        if tag not in VOID:
            self._open += 1
            self.deepest = max(self.deepest, self._open)
        if tag in ("script", "style"):
            self._hidden += 1

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self.attributes += [(tag, name, value or "") for name, value in attrs]

    def handle_endtag(self, tag: str) -> None:
        self._open = max(0, self._open - 1)
        if tag in ("script", "style") and self._hidden:
            self._hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.text.append(data)


def _read(fragment: str) -> _Reader:
    reader = _Reader()
    reader.feed(fragment)
    reader.close()
    return reader


def text_of(fragment: str) -> str:
    """The text a page shows of an HTML fragment (scripts and styles left out)."""
    return "".join(_read(fragment).text)


class _Renderer(IPythonRenderer):
    """The page's markdown renderer (nbconvert's), noting when it passes raw HTML through."""

    raw_html = False

    def block_html(self, fragment: str) -> str:
        self.raw_html = True
        return super().block_html(fragment)

    def inline_html(self, fragment: str) -> str:
        self.raw_html = True
        return super().inline_html(fragment)


def _render(source: str, attachments: dict | None) -> tuple[str, bool]:
    """(the HTML nbconvert makes of this markdown, whether it holds raw HTML); InvalidNotebook
    for a picture from an attachment that is not there (or was dropped)."""
    renderer = _Renderer(escape=False, attachments=attachments or {}, exclude_anchor_links=True)
    return MarkdownWithMath(renderer=renderer).render(source), renderer.raw_html


def markdown_renders(source: str, attachments: dict | None = None) -> bool:
    """Whether nbconvert can render it (a picture from a missing attachment stops the page)."""
    try:
        _render(source, attachments)
        return True
    except InvalidNotebook:
        return False


def markdown_is_inert(source: str, attachments: dict | None = None) -> bool:
    """Whether nbconvert renders this markdown without raw HTML and with only inert links and
    pictures (the page's own parser says, so nothing it would pass through goes unseen)."""
    try:
        shown, raw_html = _render(source, attachments)
    except InvalidNotebook:
        return False
    if raw_html:
        return False
    for tag, name, value in _read(shown).attributes:
        if name.startswith("on") or (name in URL_ATTRIBUTES and not (
                picture_is_inert(value) if tag == "img" and name == "src"
                else link_is_inert(value))):
            return False
    return True


__all__ = ["as_cleaned", "clean_html", "clean_svg", "link_is_inert", "markdown_is_inert",
           "markdown_renders", "picture_is_inert", "text_of"]
