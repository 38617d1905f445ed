"""The front door of compute: each Nova call of one cell, what it checks and writes.

:class:`~qsched.compute.api.ComputeAPI` is the front door of one cell (servers,
metadata, delete; its boot and multi-create in :mod:`~qsched.compute.boot`, its list
in :mod:`~qsched.compute.listing`, its flavor catalog in
:mod:`~qsched.compute.flavor_catalog`) and holds its parts, one module each:
:mod:`~qsched.compute.server_actions` (stop, start, reboot, instance actions),
:mod:`~qsched.compute.server_groups`, :mod:`~qsched.compute.keypairs`,
:mod:`~qsched.compute.aggregates` (os-aggregates), :mod:`~qsched.compute.services`
(os-services), :mod:`~qsched.compute.hypervisors`, :mod:`~qsched.compute.zones`,
:mod:`~qsched.compute.quotas`, :mod:`~qsched.compute.host_rules` (``same_host``,
``different_host``, 2.74's host and node) and :mod:`~qsched.compute.list_query` (a
server list's query, pure).

It may import the scheduling contract, the backends (ledger, bus, images, notifications)
and recovery, never :mod:`qsched.cells` (which serves several of these, one per cell),
the HTTP edge (:mod:`qsched.api`) or the agents.
"""
