"""Several cells behind one API: Nova's cells v2 on qsched's ledger (docs/scale.rst).

Each cell is its own keyspace (one hash slot: one Redis Cluster shard) with its own
agents and queues, a :class:`~qsched.compute.cell.Cell` of the one front door
(:class:`~qsched.compute.api.ComputeAPI`, whose every call is written once and targets
its cell through :class:`~qsched.cells.router.CellsCompute`, this package's
implementation of :class:`~qsched.compute.target.Cells`). This package holds only what
is about cells: choosing a cell (:mod:`~qsched.cells.router`, a boot's in
:mod:`~qsched.cells.booting`), the mappings, writing to every cell, the quota mover
(:mod:`~qsched.cells.mover`), joining (:mod:`~qsched.cells.join`), adoption
(:mod:`~qsched.cells.adopt`), the audit (:mod:`~qsched.cells.audit`) and the API
service's periodic tasks (:mod:`~qsched.cells.housekeeping`). It may import
:mod:`qsched.compute` and below, never the HTTP edge or the agents. Next to
the cells, the **API keyspace** (a keyspace of its own, of the cell name ``api``, as
Nova's API database beside its cell databases) holds what must be global:

* the quota of every project (``quota:<project>:*``, the same records and scripts
  as a single cell's), so that a project's limit holds across cells in one atomic
  step per instance (invariant 3);
* the instance mapping (``inst-map:<uuid>``: its cell), written before the
  instance is created in its cell, so that GET, DELETE and every action find the
  cell in one read;
* ``inst-map-pending``: the boots whose quota is reserved and whose cell record is
  not confirmed yet;
* the server group mappings (``group-map:<uuid>``: the group's cell) and each
  project's mapped groups, which its ``server_groups`` limit counts
  (:mod:`qsched.cells.groups`); the host mappings (``host-map:<host>``) and the last
  aggregate id given to every cell (:mod:`qsched.cells.aggregates`); the node mappings
  (``node-map:<node>``: the cell of a compute node a boot names).

A cell that :func:`join` made part of such a deployment (``quota-home`` set) leaves
its own quota unlimited and indexes every release of quota in ``quota-ends``, in
the script that releases it: ending an instance in ERROR or DELETED, whoever does
it (agent, janitor, reaper, API). No script can write two slots, so the API's
release is a second step: :class:`QuotaMover` applies each indexed release to the
API keyspace (idempotent: a holder is released once) and only then drops it from
the index; a crash between the two repeats a harmless release. The same mover
settles ``inst-map-pending``: a boot whose API process died between the
reservation and the cell's record is abandoned in its cell (a late create then
refuses) and its quota returned; and the server groups left pending the same way.

:func:`~qsched.cells.opening.open_cells` opens the cells from the ``[cells]``
options and :func:`~qsched.cells.opening.front_door` puts the front door over them (a
service's entry point calls both; :func:`~qsched.cells.housekeeping.start_periodic_tasks`
runs its mover; flavors and keypairs are written to every cell by one call). Each
:class:`~qsched.compute.cell.Cell` refuses a boot that does not come through the front
door, and reads the limits it checks in code from the API keyspace.
A cell whose ledger does not answer then is not joined: no boot goes there (it
would be counted twice) until a pass of the mover joins it, writing there first the
flavors and aggregates of the joined cells. A pass passes over a cell whose ledger
does not answer and moves the others' releases.

A boot goes to its availability zone's cell (``[cells] zone``), else to a cell drawn
in proportion to how many of its flavor the cell's free capacity holds (``cell-free``,
kept by its agents' heartbeats), among the cells with hosts in the aggregates its
request filters ask for (an aggregate's zone, say): one read a cell, O(cells); or to
the cell its caller names (the cell of the servers, host or server group its hints
name, :mod:`qsched.cells.booting`).
"""
