"""qsched-admin: see the queues, agents and ledger, and learn why a request was not placed.

:mod:`qsched.admin.cli` holds the click commands, each a thin edge over one
function of :mod:`~qsched.admin.queries` (reads of the ledger and the bus),
:mod:`~qsched.admin.why` (the diagnosis of one request), :mod:`~qsched.admin.capacity`
(what live agents' nodes could take now), :mod:`~qsched.admin.deadletters`,
:mod:`~qsched.admin.top`; :mod:`~qsched.admin.views` renders tables, JSON and CSV,
and :mod:`~qsched.admin.schemas` describes the JSON for scripts.

These are admin views: unlike the request path they may scan every provider,
agent and waiting request of a cell.
"""
