"""The scheduling contract: what the front door and the agents must agree on.

Below both the API and the agents, and pure (no I/O):

- :mod:`~qsched.scheduling.classes`: the scheduling class of a request (its queue's
  name and the definition agents learn from the ledger);
- :mod:`~qsched.scheduling.records`: a boot request and the instance record made
  for it, both ways, every field;
- :mod:`~qsched.scheduling.views` and :mod:`~qsched.scheduling.fit`: a node as the
  ledger describes it, and whether a request fits it (Placement's semantics).
"""
