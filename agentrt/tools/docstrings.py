"""Per-parameter descriptions and the tool description from a docstring.

Google (`Args:`), NumPy (`Parameters` + dashes) and Sphinx (`:param x:`) styles are read; a
docstring in none of them just gives its prose as the description. Types written in the
docstring are ignored: the type hints are the source of truth for the schema.
"""

from __future__ import annotations

import inspect
import re

_PARAM_SECTIONS = frozenset({
    "args", "arguments", "parameters", "params", "keyword args", "keyword arguments", "other parameters"})
_SECTIONS = _PARAM_SECTIONS | {
    "returns", "return", "yields", "raises", "examples", "example", "notes", "note", "see also",
    "references", "warnings", "warning", "attributes", "todo"}
_GOOGLE_HEADER = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*$")
_GOOGLE_ITEM = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")  # name (type): text
_NUMPY_RULE = re.compile(r"^\s*-{3,}\s*$")
_NUMPY_ITEM = re.compile(r"^([\w*][\w*, ]*?)\s*(?::.*)?$")  # name : type / x, y : int
_SPHINX_ITEM = re.compile(  # :param name: text / :param type name: text
    r"^:(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?\*{0,2}(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google, NumPy or Sphinx docstring.

    The description is the prose before the first section (Args:, Parameters/----, :param:),
    so a Returns/Raises/Examples section never leaks into it.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    start = next((i for i in range(len(lines)) if _section_at(lines, i)), len(lines))
    params = {**_numpy_params(lines), **_google_params(lines), **_sphinx_params(lines)}
    return "\n".join(lines[:start]).strip(), params


def _section_at(lines: list[str], i: int) -> bool:
    google = _GOOGLE_HEADER.match(lines[i])
    return bool((google and google[1].lower() in _SECTIONS) or _numpy_header(lines, i)
                or _SPHINX_ITEM.match(lines[i]) or lines[i].startswith((":return", ":raise", ":rtype")))


def _numpy_header(lines: list[str], i: int) -> bool:
    return i + 1 < len(lines) and bool(lines[i].strip()) and bool(_NUMPY_RULE.match(lines[i + 1]))


def _google_params(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        header = _GOOGLE_HEADER.match(line)
        if header and header[1].lower() in _PARAM_SECTIONS:
            body = []
            for row in lines[i + 1:]:
                if row.strip() and not row[:1].isspace():
                    break  # the next unindented line ends the section
                body.append(row)
            out.update(_items(inspect.cleandoc("\n".join(body)).splitlines(), _GOOGLE_ITEM))
    return out


def _numpy_params(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i in range(len(lines)):
        if _numpy_header(lines, i) and lines[i].strip().lower() in _PARAM_SECTIONS:
            end = next((j for j in range(i + 2, len(lines)) if _numpy_header(lines, j)), len(lines))
            out.update(_items(lines[i + 2:end], _NUMPY_ITEM))
    return out


def _sphinx_params(lines: list[str]) -> dict[str, str]:
    heads = [i for i, line in enumerate(lines) if line.startswith(":")] + [len(lines)]
    out: dict[str, str] = {}
    for start, end in zip(heads, heads[1:]):
        out.update(_items(lines[start:end], _SPHINX_ITEM))
    return out


def _items(lines: list[str], item: re.Pattern[str]) -> dict[str, str]:
    """Entries start at column 0 and match `item` (names in group 1, text in group 2 if any);
    indented lines continue the previous entry."""
    out: dict[str, str] = {}
    names: list[str] = []
    for line in lines:
        match = None if line[:1].isspace() else item.match(line)
        if match:
            names = [n.strip().lstrip("*") for n in match[1].split(",")]
            text = match[2] if match.re.groups > 1 else ""
            out.update({n: text.strip() for n in names})
        elif names and line.strip():
            out.update({n: f"{out[n]} {line.strip()}".strip() for n in names})
    return out
