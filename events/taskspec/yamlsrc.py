"""YAML documents with their node trees, so every problem can name a line and column.

PyYAML's safe loader (as SkyPilot's) builds the data; the composed nodes keep the marks.
Duplicate keys are refused, as SkyPilot refuses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass
class Document:
    index: int
    data: Any
    node: Node


@dataclass(frozen=True)
class Issue:
    """A problem found while reading YAML: 1-based position and message."""

    line: int | None
    column: int | None
    message: str
    document: int | None = None
    path: str = ""


def parse_documents(text: str) -> tuple[list[Document], list[Issue]]:
    """All documents of `text`; on a syntax error, the documents before it and the error."""
    docs: list[Document] = []
    issues: list[Issue] = []
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        line, column = _line_col(text, exc.position)
        return [], [Issue(line, column, f"YAML syntax error: character {exc.character:#06x} is not allowed in YAML")]
    try:
        index = 0
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                break
            found = _duplicates(node) + _recursion(node)
            for issue in found:
                issues.append(Issue(issue.line, issue.column, issue.message, index, issue.path))
            if not found:
                docs.append(Document(index, loader.construct_document(node), node))
            index += 1
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        issues.append(Issue(mark.line + 1 if mark else None, mark.column + 1 if mark else None,
                            f"YAML syntax error: {what or exc}"))
    except yaml.YAMLError as exc:
        issues.append(Issue(None, None, f"YAML syntax error: {exc}"))
    except RecursionError:
        issues.append(Issue(None, None, "YAML nested too deeply"))
    finally:
        loader.dispose()
    return docs, issues


def _line_col(text: str, position: int) -> tuple[int, int]:
    before = text[:position]
    return before.count("\n") + 1, position - (before.rfind("\n") + 1) + 1


def _key_text(node: Node) -> str | None:
    return node.value if isinstance(node, ScalarNode) else None


def _duplicates(root: Node) -> list[Issue]:
    issues: list[Issue] = []
    seen_nodes: set[int] = set()
    stack: list[tuple[Node, tuple[str | int, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, MappingNode):
            first: dict[tuple[str, str], Node] = {}
            for key, value in node.value:
                text = _key_text(key)
                stack.append((value, path + (text if text is not None else "?",)))
                if key.tag == _MERGE_TAG or not isinstance(key, ScalarNode):
                    continue
                ident = (key.tag, key.value)
                if ident in first:
                    prev = first[ident]
                    issues.append(Issue(key.start_mark.line + 1, key.start_mark.column + 1,
                                        f"duplicate key '{key.value}' (first given at line {prev.start_mark.line + 1}); "
                                        "a key may appear once in a mapping", path=".".join(map(str, path + (key.value,)))))
                else:
                    first[ident] = key
        elif isinstance(node, SequenceNode):
            stack.extend((child, path + (i,)) for i, child in enumerate(node.value))
    return sorted(issues, key=lambda i: (i.line or 0, i.column or 0))


def _recursion(root: Node) -> list[Issue]:
    """An alias that refers to a node containing it makes infinite data: refuse it."""
    on_path: set[int] = set()

    def visit(node: Node) -> Issue | None:
        if id(node) in on_path:
            return Issue(node.start_mark.line + 1, node.start_mark.column + 1,
                         "recursive YAML alias: a node may not contain itself")
        if not isinstance(node, (MappingNode, SequenceNode)):
            return None
        on_path.add(id(node))
        children: list[Node] = []
        for item in node.value:
            children.extend(item if isinstance(item, tuple) else (item,))
        for child in children:
            found = visit(child)
            if found:
                return found
        on_path.discard(id(node))
        return None

    try:
        found = visit(root)
    except RecursionError:
        return [Issue(root.start_mark.line + 1, root.start_mark.column + 1, "YAML nested too deeply")]
    return [found] if found else []


def locate(root: Node | None, path: Sequence[str | int], *, key: bool = False) -> tuple[int | None, int | None]:
    """1-based line/column of the node at `path` (of its key when `key`), or of the deepest parent found."""
    if root is None:
        return None, None
    node = root
    key_node: Node | None = None
    for elem in path:
        nxt: Node | None = None
        if isinstance(node, MappingNode):
            for k, v in reversed(node.value):  # the last duplicate wins, as in the data
                if k.tag != _MERGE_TAG and _key_text(k) is not None and _matches(k, elem):
                    key_node, nxt = k, v
                    break
        elif isinstance(node, SequenceNode) and isinstance(elem, int) and 0 <= elem < len(node.value):
            key_node, nxt = None, node.value[elem]
        if nxt is None:
            break
        node = nxt
    else:
        if key and key_node is not None:
            node = key_node
    mark = node.start_mark
    return mark.line + 1, mark.column + 1


def _matches(key: ScalarNode, elem: str | int) -> bool:
    if key.value == str(elem):
        return True
    # Keys the loader turned into other types (true, 1.0, ...) compare by their text.
    return isinstance(elem, str) and key.value.lower() == elem.lower() and key.tag != "tag:yaml.org,2002:str"
