"""Checkpoint buckets on nodes (services/agent/storage.py): download before setup, changes sent
back, deletions mirrored; against a directory store and against S3 on the fake AWS."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from skypurza.services.agent.storage import (
    BucketMount,
    Checkpoints,
    DirStore,
    S3Store,
    Syncer,
    bucket_mounts,
    store_kind,
    without,
)


def exercise(store, tmp_path: Path) -> None:
    node1, node2 = tmp_path / "node1" / "ckpt", tmp_path / "node2" / "ckpt"
    first = Syncer([BucketMount("ckpt-bucket", node1)], store)
    assert first.download() == 0 and node1.is_dir()  # a new bucket: created, nothing in it
    (node1 / "step-1.pt").write_text("one")
    (node1 / "sub").mkdir()
    (node1 / "sub" / "meta.json").write_text("{}")
    assert first.upload() == 2
    assert first.upload() == 0  # nothing changed since
    time.sleep(0.01)
    (node1 / "step-1.pt").write_text("one, longer")
    (node1 / "sub" / "meta.json").unlink()
    assert first.upload() == 1
    assert sorted(store.keys("ckpt-bucket")) == ["step-1.pt"]
    # A new node (the recovery) sees what the first one saved.
    second = Syncer([BucketMount("ckpt-bucket", node2)], store)
    assert second.download() == 1
    assert (node2 / "step-1.pt").read_text() == "one, longer"
    assert second.upload() == 0  # what was downloaded is not sent back
    # COPY mode never writes back.
    copy = Syncer([BucketMount("ckpt-bucket", tmp_path / "node3", mode="COPY")], store)
    copy.download()
    (tmp_path / "node3" / "new").write_text("x")
    assert copy.upload() == 0 and "new" not in store.keys("ckpt-bucket")


def test_directory_store(tmp_path):
    exercise(DirStore(tmp_path / "buckets"), tmp_path)


def test_s3_store_on_the_fake_aws(fake_aws, tmp_path):
    exercise(S3Store(fake_aws.client(service="s3")), tmp_path)


def test_which_mounts_are_buckets_and_which_store(tmp_path):
    mounts = {"/ckpt": {"name": "b1", "store": "s3"}, "~/seeded": {"name": "b2", "store": "S3", "source": "./init"},
              "/data": {"name": "b3", "store": "s3", "source": "s3://other/prefix"},
              "/g": {"name": "b4", "store": "gcs"}, "/plain": "./x"}
    found = bucket_mounts(mounts, tmp_path)
    assert [(b.name, b.dest, b.mode) for b in found] == [("b1", Path("/ckpt"), "MOUNT"),
                                                        ("b2", tmp_path / "seeded", "MOUNT")]
    assert found[1].seed == Path(os.path.expanduser("./init"))
    assert sorted(without(mounts, found, tmp_path)) == ["/data", "/g", "/plain"]
    assert store_kind("aws", {}) == "s3" and store_kind("local", {}) == "dir"
    assert store_kind("local", {"AWS_ACCESS_KEY_ID": "x"}) == "s3"
    assert store_kind("aws", {"SKYPURZA_BUCKET_STORE": "dir"}) == "dir"


def test_checkpoints_sync_periodically_and_at_detach(tmp_path, monkeypatch):
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path / "spz"))
    monkeypatch.setenv("SKYPURZA_BUCKET_STORE", "dir")
    seed = tmp_path / "init"
    seed.mkdir()
    (seed / "config.yaml").write_text("lr: 1")

    async def main():
        cp = Checkpoints("local", "test", interval=0.1)
        home = tmp_path / "node"
        rest = await cp.attach(1, {"~/ckpt": {"name": "run1", "store": "s3", "source": str(seed)}, "/x": "./y"}, home)
        assert rest == {"/x": "./y"}
        ckpt = home / "ckpt"
        assert (ckpt / "config.yaml").read_text() == "lr: 1"  # an empty bucket starts from its source
        (ckpt / "epoch-1").write_text("w1")
        store = DirStore(tmp_path / "spz" / "test" / "buckets")
        for _ in range(50):
            if "epoch-1" in store.keys("run1"):
                break
            await asyncio.sleep(0.05)
        assert sorted(store.keys("run1")) == ["config.yaml", "epoch-1"]  # sent while running
        (ckpt / "epoch-2").write_text("w2")
        await cp.detach(1)
        assert "epoch-2" in store.keys("run1")  # the last upload at the end of the run

    asyncio.run(main())
