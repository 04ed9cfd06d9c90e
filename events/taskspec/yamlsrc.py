"""YAML documents with their node trees, so every problem can name a line and column.

PyYAML's safe loader (as SkyPilot's) builds the data; the composed nodes keep the marks.
Duplicate keys are refused, as SkyPilot refuses them.

The loader is bounded (`events/limits.py`): it counts every node as it composes, an alias as
the whole subtree it stands for, and stops at the first alias (or node) past the bound, so a
billion-laughs file is refused after reading a few lines, at any depth. Nesting is bounded too.
Scalars that YAML resolves to a type but cannot build (`2026-13-45` as a date, an integer of
100,000 digits) are positioned problems, never a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from skypurza.events.limits import MAX_YAML_DEPTH, MAX_YAML_NODES

_MERGE_TAG = "tag:yaml.org,2002:merge"
# Integers are refused past 64 bits: no key takes more, and Python will not even turn a
# 4,300-digit text into an int (nor print one back).
_INT_LIMIT = 2**63
_MAX_INT_DIGITS = 19


class Refused(yaml.MarkedYAMLError):
    """A document the loader will not build (too big, not buildable): its message and mark."""

    path: tuple[str | int, ...] = ()  # where in the document, when known while composing
    node: Node | None = None  # the scalar that could not be built (its path is looked up)


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts expanded nodes and nesting, and positions construction errors."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> nodes it stands for, aliases expanded
        self._count = 0
        self._depth = 0
        self._path: list[str | int | None] = []

    def compose_document(self) -> Node:
        self._sizes, self._count, self._depth, self._path = {}, 0, 0, []
        return super().compose_document()  # type: ignore[no-any-return]

    def _refuse(self, message: str, mark: Any) -> Refused:
        exc = Refused(None, None, message, mark)
        exc.path = tuple(p for p in self._path if p is not None)
        return exc

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            target = self.anchors.get(event.anchor)
            # A node still being composed (a recursive alias) counts 1; _recursion refuses it.
            adds = self._sizes.get(id(target), 1) if target is not None else 1
            self._count += adds
            self._path.append(_elem(index))
            if self._count > MAX_YAML_NODES:
                raise self._refuse(f"too many aliases: expanding them gives more than {MAX_YAML_NODES:,} YAML "
                                   f"nodes (alias *{event.anchor} alone stands for {adds:,})", event.start_mark)
            self._path.pop()
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        self._count += 1
        self._path.append(_elem(index))
        if self._count > MAX_YAML_NODES:
            raise self._refuse(f"too many YAML nodes: a task document has at most {MAX_YAML_NODES:,}",
                               event.start_mark)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise self._refuse(f"YAML nested too deeply: at most {MAX_YAML_DEPTH} levels", event.start_mark)
        node: Node = super().compose_node(parent, index)
        self._depth -= 1
        self._path.pop()
        size = 1
        if isinstance(node, SequenceNode):
            size += sum(self._sizes.get(id(child), 1) for child in node.value)
        elif isinstance(node, MappingNode):
            size += sum(self._sizes.get(id(k), 1) + self._sizes.get(id(v), 1) for k, v in node.value)
        self._sizes[id(node)] = size
        return node

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except yaml.MarkedYAMLError:
            raise
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:
            what = {"tag:yaml.org,2002:timestamp": "a date", "tag:yaml.org,2002:int": "an integer"}.get(node.tag)
            shown = _short(str(node.value)) if isinstance(node, ScalarNode) else node.tag
            detail = f" ({exc})" if isinstance(exc, (ValueError, OverflowError)) and what == "a date" else ""
            message = (f"{shown} reads as {what} but is not a valid one{detail}; quote it to make it a string"
                       if what else f"cannot read {shown} as {node.tag}: {exc}")
            refused = Refused(None, None, message, node.start_mark)
            refused.node = node
            raise refused from None


def _elem(index: Any) -> str | int | None:
    """The path element of a node composed at `index`: its key's text, its list index, None for a key."""
    if isinstance(index, int):
        return index
    if isinstance(index, ScalarNode):
        return str(index.value)
    return None


def _path_to(root: Node, target: Node) -> tuple[str | int, ...]:
    """The key path of `target` inside `root` (each shared node walked once)."""
    seen: set[int] = set()
    stack: list[tuple[Node, tuple[str | int, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            for k, v in node.value:
                stack.append((v, path + (str(k.value) if isinstance(k, ScalarNode) else "?",)))
                stack.append((k, path))
        elif isinstance(node, SequenceNode):
            stack.extend((child, path + (i,)) for i, child in enumerate(node.value))
    return ()


def _short(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:20]!r}...({len(text):,} characters)"


def _construct_int(loader: SafeConstructor, node: ScalarNode) -> int:
    text = str(node.value).replace("_", "").lstrip("+-")
    decimal = text.isdigit() and not (len(text) > 1 and text.startswith("0"))
    too_large = (decimal and len(text) > _MAX_INT_DIGITS) or len(text) > 80
    value: int = 0 if too_large else SafeConstructor.construct_yaml_int(loader, node)
    if too_large or not -_INT_LIMIT <= value < _INT_LIMIT:
        refused = Refused(None, None, f"integer {_short(str(node.value))} is too large: at most {_INT_LIMIT - 1} "
                                      "(a 64-bit integer)", node.start_mark)
        refused.node = node
        raise refused
    return value


BoundedLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


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
        loader = BoundedLoader(text)
    except yaml.reader.ReaderError as exc:
        line, column = _line_col(text, exc.position)
        return [], [Issue(line, column, f"YAML syntax error: character {exc.character:#06x} is not allowed in YAML")]
    node: Node | None = None
    index = 0
    try:
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
    except Refused as exc:
        mark = exc.problem_mark
        where = _path_to(node, exc.node) if exc.node is not None and node is not None else exc.path
        issues.append(Issue(mark.line + 1 if mark else None, mark.column + 1 if mark else None, str(exc.problem),
                            index, ".".join(map(str, where))))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        if "'\\t'" in (exc.problem or ""):  # PyYAML's words for it are obscure
            what = "YAML forbids tabs for indentation: use spaces"
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
    done: set[int] = set()  # shared nodes (aliases) are walked once, not once per reference

    def visit(node: Node) -> Issue | None:
        if id(node) in on_path:
            return Issue(node.start_mark.line + 1, node.start_mark.column + 1,
                         "recursive YAML alias: a node may not contain itself")
        if not isinstance(node, (MappingNode, SequenceNode)) or id(node) in done:
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
        done.add(id(node))
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
