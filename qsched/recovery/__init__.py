"""Recovery: what finishes the work a crash, an outage or a silent agent left behind.

* :mod:`~qsched.recovery.janitor`: the builds and deletes of agents whose heartbeat
  expired, taken over (their claims held for them), and the boot requests rebuilt
  from records (:func:`~qsched.recovery.janitor.requeue_orphan`, shared with the
  agent's own reconcile);
* :mod:`~qsched.recovery.outbox`: boot requests recorded and never confirmed by the
  broker, published again;
* :mod:`~qsched.recovery.reaper`: requests nobody placed before their deadline, ended
  in NoValidHost.

Both the API service and the compute agents run these, so this package sits below the
front door (:mod:`qsched.compute.api`) and cells (:mod:`qsched.cells`) and imports neither:
only the scheduling contract, the ledger, the bus and the notifications.
"""
