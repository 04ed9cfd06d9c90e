"""Dispatch (platform): admission, quotas, fairshare and priority with Slurm's and Kueue's semantics."""
