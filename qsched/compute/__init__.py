"""The front door of compute: each Nova call, written once, and what it does in a cell.

:class:`~qsched.compute.api.ComputeAPI` is the front door (what the HTTP layer calls
of it is the protocol :class:`~qsched.compute.front_door.FrontDoor`). Each call is
written once and runs in the cell it targets, as Nova's cells v2 compute API does
(``target_cell``): :class:`~qsched.compute.target.Cells` is what the front door asks
of its cells (the cell of a server, the cell a boot goes into, every cell for a write
they all keep), :class:`~qsched.compute.target.OneCell` its one-cell case, and
:class:`qsched.cells.router.CellsCompute` its several-cells one.

* the front door: :mod:`~qsched.compute.api` (servers, metadata, delete, health), its
  list (:mod:`~qsched.compute.listing`, gathering a page over cells; the query, pure,
  in :mod:`~qsched.compute.list_query`), its flavor catalog
  (:mod:`~qsched.compute.flavor_catalog`), and its parts over cells
  (:mod:`~qsched.compute.parts`: keypairs, actions, hypervisors, services, zones;
  ``Groups`` in :mod:`~qsched.compute.server_groups`; ``Aggregates`` in
  :mod:`~qsched.compute.aggregates`);
* one cell: :class:`~qsched.compute.cell.Cell` (its stores, bus and caches, and the
  steps a call takes there), its boot and multi-create (:mod:`~qsched.compute.boot`),
  and its parts, one module each: :mod:`~qsched.compute.server_actions` (stop, start,
  reboot, instance actions), :mod:`~qsched.compute.server_groups`,
  :mod:`~qsched.compute.keypairs`, :mod:`~qsched.compute.aggregates` (the request
  filters), :mod:`~qsched.compute.services`, :mod:`~qsched.compute.hypervisors`,
  :mod:`~qsched.compute.zones`, :mod:`~qsched.compute.quotas`,
  :mod:`~qsched.compute.host_rules` (``same_host``, ``different_host``, 2.74's host and
  node); a server the caller may see: :mod:`~qsched.compute.visible`.

It may import the scheduling contract, the backends (ledger, bus, images, notifications)
and recovery, never :mod:`qsched.cells` (which implements ``Cells`` over several cells),
the HTTP edge (:mod:`qsched.api`) or the agents.
"""
