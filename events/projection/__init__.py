"""What every projection of the log into DuckDB shares (open code: the status service's and the
ledger's alike; docs/status.md, docs/ledger.md).

- `logreader.py`: the log in order, in large batches (an ephemeral pull consumer);
- `records.py`: bytes from the log -> a `Record` (`events.envelope.decode` itself);
- `tables.py`: table definitions and the three tables every projection file has (checkpoint,
  applied event ids, skipped events);
- `state.py`: the in-memory rows a batch changes, and `apply` (one record, idempotent per event id);
- `store.py`: a file, its state, and one batch written with its checkpoint in ONE transaction;
- `pipeline.py`: batches applied while the previous one commits; a failing batch bisected down to
  the one event that fails on its own, which is recorded as skipped and handed on to be parked;
- `compare.py`: two files compared table by table (audits);
- `fleet.py`: the reducers of placements, clusters, nodes and node runs, which both projections keep.
"""
