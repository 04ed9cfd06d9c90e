"""The environment a task's setup and run start from: the node user's, never the agent's.

SkyPilot 0.14.1 runs each phase as one bash script: `source ~/.bashrc`, its conda profile,
deactivate the SkyPilot runtime, activate `~/sky-user-env` if present, `export
PYTHONUNBUFFERED=1`, `cd ~/sky_workdir`, export the task's and the predefined variables, then the
user's script (docs/agent.md, "The task's environment"). We do the same, so that
`echo 'export X=1' >> ~/.bashrc` in setup is seen by run, conda activation works, and nothing of
the agent's own runtime (its virtualenv on PATH, PYTHONPATH, our internal SKYPURZA_* settings)
reaches a task: a task's `pip install` must land in the user's environment, not in ours.

On the `local` infra a node shares this machine's Python with the agent (and with `spz` itself),
so each local node gets its own user environment, `~/sky-user-env` in the node's home: a virtual
environment over the machine's Python (`--system-site-packages`: the user sees what is
installed) where the task's `pip install` goes. The agent never imports from it, so a task that
installs `pydantic<2` changes its own jobs, not the agent that runs them.

Pure functions (`base_environment`, `phase_script`) are tested directly; `ensure_user_env` is the
one piece of I/O.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

USER_ENV_DIRNAME = "sky-user-env"  # SkyPilot activates ~/sky-user-env when it exists
READY_MARK = ".ready"
KEYS_VAR = "SKYPURZA_JOB_ENV_KEYS"  # the variables the phase re-exports after ~/.bashrc

# Python's own knobs that would point a task's interpreter at the agent's packages.
_PYTHON_RUNTIME_VARS = ("VIRTUAL_ENV", "VIRTUAL_ENV_PROMPT", "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE",
                        "PYTHONSTARTUP", "PYTHONEXECUTABLE", "__PYVENV_LAUNCHER__")
# Everything of ours the agent was started with (stage, NATS URL, its own tuning): a task gets the
# documented SKYPURZA_* aliases of the contract instead, added after this.
_OURS_PREFIX = "SKYPURZA_"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Runtime:
    """Where the agent's own Python lives: its virtualenv's bin directory, when it runs in one."""

    venv_bin: str | None

    @classmethod
    def current(cls) -> "Runtime":
        in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
        return cls(venv_bin=str(Path(sys.prefix) / "bin") if in_venv else None)


def base_environment(agent_env: Mapping[str, str], runtime: Runtime) -> dict[str, str]:
    """The agent's process environment with our runtime taken out: the node user's environment."""
    env = {k: v for k, v in agent_env.items()
           if k not in _PYTHON_RUNTIME_VARS and not k.startswith(_OURS_PREFIX)}
    if runtime.venv_bin and "PATH" in env:
        kept = [p for p in env["PATH"].split(os.pathsep) if p and os.path.normpath(p) != os.path.normpath(
            runtime.venv_bin)]
        env["PATH"] = os.pathsep.join(kept)
    return env


def phase_script(user_script: str, workdir: Path, keys: Iterable[str]) -> str:
    """The bash script a phase runs: the login prelude, then the user's script unchanged.

    The values of `keys` (the task's envs, secrets and the SKYPILOT_* contract) come in through
    the process environment, never written to disk; they are saved before `~/.bashrc` runs and
    exported again after it, so the task's values win over the user's shell files, as in SkyPilot.
    """
    names = " ".join(k for k in dict.fromkeys(keys) if _NAME.match(k))
    prelude = f"""\
# Written by the SkyPurza node agent: the node user's login environment, as SkyPilot gives it.
__spz_keep=$(for __spz_k in {names}; do printf 'export %s=%q\\n' "$__spz_k" "${{!__spz_k}}"; done)
if [ -f ~/.bashrc ]; then source ~/.bashrc; fi
if [ -f ~/{USER_ENV_DIRNAME}/bin/activate ]; then source ~/{USER_ENV_DIRNAME}/bin/activate; fi
eval "$__spz_keep"; unset __spz_keep __spz_k {KEYS_VAR}
export PYTHONUNBUFFERED=1
cd {shlex.quote(str(workdir))} || exit 1
# ---- the task's script
"""
    return prelude + user_script + ("" if user_script.endswith("\n") else "\n")


def job_process_environment(agent_env: Mapping[str, str], runtime: Runtime, job_env: Mapping[str, str],
                            home: Path | None = None) -> dict[str, str]:
    """The environment a phase's process starts with: the user's, the job's variables on top
    (and the list of them for `phase_script`), HOME set for a local node."""
    env = base_environment(agent_env, runtime)
    env.update(job_env)
    if home is not None:
        env["HOME"] = str(home)  # each local node is a machine with its own home
    env[KEYS_VAR] = " ".join(job_env)
    return env


_PIP_SHIM = '#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n'


def ensure_user_env(home: Path, python: str | None = None, timeout_s: float = 60.0) -> Path:
    """`home/sky-user-env`, created once (a fraction of a second: no pip copy; `pip` in it runs the
    machine's pip module, which installs into the environment it runs in). A creation cut short
    (no ready mark) is made again."""
    target = home / USER_ENV_DIRNAME
    ready = target / READY_MARK
    if ready.exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    if python is None:  # this Python's own: made in this process (no interpreter start, ~0.1 s of CPU)
        import venv

        # What `python -m venv --system-site-packages --without-pip` makes, over the base Python.
        venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=os.name != "nt").create(str(target))
    else:
        subprocess.run([python, "-m", "venv", "--system-site-packages", "--without-pip", str(target)], check=True,
                       timeout=timeout_s, stdin=subprocess.DEVNULL, capture_output=True)
    for name in ("pip", "pip3"):
        shim = target / "bin" / name
        shim.write_text(_PIP_SHIM)
        shim.chmod(0o755)
    ready.touch()
    return target
