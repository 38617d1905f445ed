"""``qsched-chaos``: start real stacks, load them, break things, check nothing was lost.

A run starts, per transport, a real multi-process qsched (the API under
gunicorn, several ``qsched-agent`` processes driving fake nodes, a ledger on a
``redis-server`` of its own with AOF persistence, the bus on RabbitMQ or on a
second ``redis-server`` of its own), sends a sustained stream of boots and
deletes through HTTP, and meanwhile injects faults: SIGKILL and SIGTERM of
agents (restarted afterwards), a broker restart and a ledger restart. It then
waits for quiescence and checks the invariants from the ledger's own records,
independently of what the services say: nothing lost, nothing placed twice, no
over-commit, no leaked allocation or quota, and no partial state behind a 503.

Modules: :mod:`.servers` (the Redis servers it owns, RabbitMQ control),
:mod:`.stack` (the processes), :mod:`.load` (the HTTP load), :mod:`.faults`
(the fault plan and injectors), :mod:`.checks` (the invariants),
:mod:`.report` (figures and the table), :mod:`.runner` (one run) and
:mod:`.cli` (the command).
"""
