"""qsched-bench: issue 6's benchmark of qsched against cloud size, load and packing.

Modules:

* :mod:`qsched.bench.cli` -- the ``qsched-bench`` command;
* :mod:`qsched.bench.scenarios` -- scale sweep, saturation, fill;
* :mod:`qsched.bench.moves` -- resizes and live migrations per N, and
  :mod:`qsched.bench.emptying`: a host drained, a host evacuated;
* :mod:`qsched.bench.stack` -- the cloud they run on: processes on real servers
  (started and removed with :mod:`qsched.stack`; :mod:`qsched.bench.embedded`: the
  embedded default);
* :mod:`qsched.bench.agent` -- one agent process with its start timed
  (:mod:`qsched.bench.timing`);
* :mod:`qsched.bench.load` -- the open-loop load generator (HTTP and library call);
* :mod:`qsched.bench.phase`, :mod:`qsched.bench.measure` -- one timed phase, and
  what the ledger says happened;
* :mod:`qsched.bench.packing` -- flavor streams and the offline best-fit reference;
* :mod:`qsched.bench.report`, :mod:`qsched.bench.machine` -- targets, tables, the
  plot, and the machine facts (:mod:`qsched.bench.tables`: the tables' text;
  :mod:`qsched.bench.moves_report`: the moves scenario's);
* :mod:`qsched.bench.cpu`, :mod:`qsched.bench.profile` -- CPU used per part during a
  phase, and py-spy profiles of the processes.
"""
