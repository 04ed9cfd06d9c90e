"""Fake `nvidia-smi`, `dmesg` and (with `dcgm=True`) `dcgmi` executables for tests: they print
recorded outputs (tests/fixtures/gpu/<case>/: smi.txt, dmesg.txt, rc; dcgm_discovery.txt,
dcgm_dmon.txt, dcgm_rc, dcgm_hang) so the agent's whole sampling path runs on a CPU machine.
Which case a node sees is chosen by its working directory (a local node's home is
`.../clusters/<cluster>/node-<rank>`, and the agent runs there): `SPZ_FAKE_GPU_MAP` maps cluster
names to cases ("c1=healthy,c2=xid79"); other clusters see `SPZ_FAKE_GPU_DEFAULT` (healthy)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gpu"
CASES = ("healthy", "xid79", "ecc", "missing")

_SCRIPT = """#!/bin/sh
case_dir() {
  c="${SPZ_FAKE_GPU_DEFAULT:-healthy}"
  for pair in $(echo "$SPZ_FAKE_GPU_MAP" | tr ',' ' '); do
    name="${pair%%=*}"; value="${pair#*=}"
    case "$PWD/" in */clusters/"$name"/*) c="$value";; esac
  done
  echo "FIXTURES/$c"
}
d="$(case_dir)"
"""

_SMI = _SCRIPT + """if [ "$1" = "--query-gpu=name" ]; then grep -E '^[0-9]+,' "$d/smi.txt" | cut -d, -f2 | sed 's/^ //'; exit 0; fi
case "$*" in *--query-gpu=*) ;; *) echo "fake nvidia-smi: unexpected $*" >&2; exit 2;; esac
cat "$d/smi.txt"
if [ -f "$d/rc" ]; then exit "$(cat "$d/rc")"; fi
"""
_DMESG = _SCRIPT + 'cat "$d/dmesg.txt"\n'
# `dcgmi discovery -l` and `dcgmi dmon -e <ids> -c 1`; a case with `dcgm_hang` never answers (its pid
# goes to $SPZ_FAKE_DCGM_PIDFILE, so a test can see it was killed).
_DCGMI = _SCRIPT + """if [ -f "$d/dcgm_hang" ]; then echo $$ > "${SPZ_FAKE_DCGM_PIDFILE:-/dev/null}"; exec sleep 60; fi
case "$1" in
  discovery) f="$d/dcgm_discovery.txt";;
  dmon) f="$d/dcgm_dmon.txt";;
  *) echo "fake dcgmi: unexpected $*" >&2; exit 2;;
esac
[ -f "$f" ] && cat "$f"
if [ -f "$d/dcgm_rc" ]; then exit "$(cat "$d/dcgm_rc")"; fi
"""


def install(bin_dir: Path, *, dcgm: bool = False) -> Path:
    """Write the fakes into `bin_dir` (put it first on PATH); returns it. `dcgm`: a fake `dcgmi`
    too (without it the node has no DCGM, and the agent reads nvidia-smi)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tools = [("nvidia-smi", _SMI), ("dmesg", _DMESG)] + ([("dcgmi", _DCGMI)] if dcgm else [])
    for name, body in tools:
        path = bin_dir / name
        path.write_text(body.replace("FIXTURES", str(FIXTURES)))
        path.chmod(0o755)
    return bin_dir
