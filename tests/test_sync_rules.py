"""How a workdir and file mounts are put in place on a node (services/agent/mounts.py,
syncignore.py): `.skyignore` (else `.gitignore`) honoured as SkyPilot syncs, a local node never
writing outside its own home without consent, and object stores we lack refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from skypurza.services.agent import mounts


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _copied(src: Path, dest: Path) -> set[str]:
    for step in mounts.plan(str(src), None, dest):
        mounts.apply_step(step)
    out = dest / mounts.SKY_WORKDIR
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}


def test_skyignore_at_the_root_is_the_only_ignore_file(tmp_path: Path):
    src = tmp_path / "proj"
    _tree(src, {".skyignore": "*.ckpt\ndata/\n!keep.ckpt\n/top.txt\n", ".gitignore": "*.py\n",
                "train.py": "x", "model.ckpt": "x", "keep.ckpt": "x", "data/big.bin": "x", "top.txt": "x",
                "sub/top.txt": "x", "sub/m.ckpt": "x", "sub/.gitignore": "*.txt\n"})
    got = _copied(src, tmp_path / "node")
    # .gitignore files are not read when a .skyignore exists (train.py and sub/top.txt stay).
    assert got == {".skyignore", ".gitignore", "train.py", "keep.ckpt", "sub/top.txt", "sub/.gitignore"}


def test_without_skyignore_every_gitignore_rules_its_own_directory(tmp_path: Path):
    src = tmp_path / "proj"
    _tree(src, {".gitignore": "*.log\nbuild/\n", "a.py": "x", "a.log": "x", "build/out.o": "x",
                "pkg/.gitignore": "*.tmp\n!important.log\n", "pkg/b.py": "x", "pkg/b.tmp": "x",
                "pkg/important.log": "x", "pkg/other.log": "x", "c.tmp": "x"})
    got = _copied(src, tmp_path / "node")
    assert got == {".gitignore", "a.py", "pkg/.gitignore", "pkg/b.py", "pkg/important.log", "c.tmp"}


def test_a_directory_without_ignore_files_is_copied_whole(tmp_path: Path):
    src = tmp_path / "proj"
    _tree(src, {"a.log": "x", "d/e.txt": "x"})
    assert _copied(src, tmp_path / "node") == {"a.log", "d/e.txt"}


def test_a_local_node_refuses_a_destination_outside_its_home(tmp_path: Path):
    home = tmp_path / "node-0"
    src = tmp_path / "f.txt"
    src.write_text("x")
    with pytest.raises(mounts.SyncError) as err:
        mounts.plan(None, {"/data": str(src), "~/ok": str(src)}, home, confined=True)
    msg = str(err.value)
    assert "file mount /data" in msg and "this machine's own file system" in msg and mounts.HOST_PATHS_ENV in msg
    # Under the node's home, relative and ~ destinations are fine; so is /data with consent.
    steps = mounts.plan(None, {"~/ok": str(src), "rel/x": str(src), str(home / "abs"): str(src)}, home, confined=True)
    assert [s.dest for s in steps] == [home / "ok", home / "rel" / "x", home / "abs"]
    assert mounts.plan(None, {"/data": str(src)}, home, confined=False)[0].dest == Path("/data")
    assert mounts.host_paths_allowed({mounts.HOST_PATHS_ENV: "1"}) and not mounts.host_paths_allowed({})
    # A path that only looks inside (a sibling with the home as prefix) is outside.
    with pytest.raises(mounts.SyncError):
        mounts.plan(None, {str(tmp_path / "node-0-evil" / "x"): str(src)}, home, confined=True)


def test_an_object_store_we_lack_is_refused_by_name(tmp_path: Path):
    steps = mounts.plan(None, {"/ckpt": {"name": "my-bucket", "store": "gcs", "mode": "MOUNT"}}, tmp_path)
    assert [(s.kind, s.source) for s in steps] == [("unsupported", "store: gcs (bucket my-bucket)")]
    with pytest.raises(mounts.SyncError) as err:
        mounts.apply_step(steps[0])
    assert "not supported yet" in str(err.value) and "skypilot-temp" not in str(err.value)
    s3 = mounts.plan(None, {"/ckpt": {"name": "my-bucket", "store": "S3"}}, tmp_path)
    assert [(s.kind, s.source) for s in s3] == [("s3", "s3://my-bucket")]
