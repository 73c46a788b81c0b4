"""Hangs and lost peers: found, named, answered. Floor: above ``recovery/``, whose executor the response calls;
below ``runtime/``.

- :mod:`.watchdog`: the allowances (learned step, save, load and phase times) and the check the watcher thread runs.
- :mod:`.stacks`: where a failing rank's stacks and traceback go (a file beside the event log, named in one line).
- :mod:`.census`: who is stuck, asked through the rendezvous store, not through a collective; the suspects.
- :mod:`.response`: what a rank does when the watchdog fires or a peer is lost (stacks, census, the recovery
  executor, exit 5).
- :mod:`.monitor`: the part ``init()`` builds: the watchdog, the census, the response and the start-up barrier,
  wired to one run.
- :mod:`.state`: the run state the stop controller writes and the monitor reads (heartbeat, activity, agreement,
  the nodes to leave out); the Runtime builds one per run.
"""
