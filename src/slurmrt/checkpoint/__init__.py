"""Checkpoints that are complete or absent, the same on every rank. Floor: above ``launch/`` and ``stop/``; below
``recovery/``, ``hang/`` and ``runtime/``.

- :mod:`.session`: one run's saves and loads, between the training loop and the store (handed its :mod:`.settings`
  section).

- :mod:`.store`: the commit protocol, background saves and pruning; :mod:`.loading`: the newest sound checkpoint,
  agreed by every rank.
- :mod:`.reader`: what a run reads from a sound checkpoint, or why it cannot.
- :mod:`.manifest`: the manifest's form and the check of the files against it.
- :mod:`.retention`: which checkpoints are kept; deletion out of sight.
- :mod:`.background`: a save in flight (``PendingSave``) and the two-part save (``Staged``).
- :mod:`.staging`: the host-buffer snapshot a background save writes.
- :mod:`.helper` and :mod:`.shm`: the save helper process and the shared memory it reads.
- :mod:`.parts`: one rank's state written in parts, by threads.
- :mod:`.sharded`: sharded state (DTensor) through DCP, planned and written by each rank alone.
- :mod:`.local`: the node-local tier, replicated to a partner node (:mod:`.partners`: who keeps each part).
- :mod:`.lease`: one live job per checkpoint directory (:mod:`.holder`: the lease's record, read back).
  :mod:`.trust`: whose files a job loads, and where.
- :mod:`.cadence`: when to save, from measurements (``rt.should_save``). :mod:`.progress`: a long save or load, said.
- :mod:`._files`: durable writes, checksums, the disk's early writeback.
"""
