"""The session's real Slurm (slurm_rig.py), for every test that needs one."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from slurm_rig import SlurmRig, available


@pytest.fixture(scope="session")
def slurm_rig():
    why = available()
    if why:
        raise RuntimeError(f"the Slurm rig cannot start: {why}")
    # Not under pytest's tmp_path: slurmctld runs as the slurm user, who cannot enter a 0700 directory.
    root = Path(tempfile.mkdtemp(prefix="spz-slurm-"))
    root.chmod(0o755)
    rig = SlurmRig(root).start()
    yield rig
    rig.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_accounted_rig():
    """A second real Slurm with slurmdbd and MariaDB (sacct, GPU billing weights): only the billing
    test asks for it, so the other Slurm tests do not pay for its start."""
    why = available()
    if why:
        raise RuntimeError(f"the Slurm rig cannot start: {why}")
    root = Path(tempfile.mkdtemp(prefix="spz-slurmdbd-"))
    root.chmod(0o755)
    rig = SlurmRig(root, accounting=True).start()
    yield rig
    rig.stop()
    shutil.rmtree(root, ignore_errors=True)
