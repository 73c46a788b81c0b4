"""Checkpoints that are complete or absent, the same on every rank.

- :mod:`.store`: the commit protocol, background saves, pruning, and loading the newest sound checkpoint.
- :mod:`._files`: durable writes (fsync of files, directories and trees).
"""
