"""`--env-file` / `--secret-file`: dotenv files, read as SkyPilot reads them (python-dotenv's
syntax: `KEY=VALUE`, `export KEY=VALUE`, `#` comments, single- or double-quoted values, and in
double quotes the escapes \\n \\t \\" \\\\).

`parse_dotenv` is pure (text in, pairs or problems out); `read_dotenv` reads the file, bounded
by the size the task model allows for every env and secret together.
"""

from __future__ import annotations

import re
from pathlib import Path

from skypurza.events import limits

_LINE_RE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*(?:=\s*(.*?))?\s*$")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'"}


class DotenvError(ValueError):
    """A dotenv file we cannot read: the message names the file and the line."""


def _unquote(raw: str) -> str:
    if len(raw) >= 2 and raw[0] == raw[-1] == "'":
        return raw[1:-1]
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], "\\" + m[1]), raw[1:-1])
    # Unquoted: a ` #` starts a comment, as in python-dotenv.
    return re.split(r"\s+#", raw, maxsplit=1)[0].rstrip()


def parse_dotenv(text: str, where: str) -> dict[str, str]:
    """The pairs of a dotenv file, in order; a later duplicate wins. A key without `=` is left
    out (python-dotenv gives it no value, and SkyPilot drops such keys)."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = _LINE_RE.match(line)
        if not m:
            shown = stripped if len(stripped) <= 60 else stripped[:57] + "..."
            raise DotenvError(f"{where}:{number}: expected KEY=VALUE, found {shown!r}")
        key, raw = m[1], m[2]
        if raw is None:
            continue
        out[key] = _unquote(raw)
    return out


def read_dotenv(path: str, flag: str) -> dict[str, str]:
    """Read and parse one dotenv file named by `flag`; DotenvError says what is wrong."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DotenvError(f"{flag} {path}: no such file")
    size = p.stat().st_size
    if size > limits.MAX_ENV_TOTAL_BYTES:
        raise DotenvError(f"{flag} {path}: {size:,} bytes; at most {limits.MAX_ENV_TOTAL_BYTES:,} "
                          "(every env and secret together)")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DotenvError(f"{flag} {path}: cannot read it: {exc}") from None
    return parse_dotenv(text, f"{flag} {path}")
