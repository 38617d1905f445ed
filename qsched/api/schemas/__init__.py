"""JSON schemas of the request bodies, in Nova's shapes, one module per resource.

What it holds: :mod:`~qsched.api.schemas.servers` (create, update, metadata, the
scheduler hints), :mod:`~.server_actions`, :mod:`~.flavors`, :mod:`~.keypairs`,
:mod:`~.server_groups`, :mod:`~.aggregates`, :mod:`~.quotas` and :mod:`~.services`;
the field types they share in :mod:`~.parameter_types` (Nova's name); and
:mod:`~.validation`, how a schema is compiled and a body checked. Its modules import
jsonschema, :mod:`qsched.exception` and one another, nothing else of qsched's: the
handlers in :mod:`qsched.api` import them, never the other way.

How schemas are compiled: each resource module writes its schemas as plain dicts
(lower-case names, such as ``servers.group_hint``, whose ``x-message`` a handler may
quote) and compiles each once, when the module is imported, with
:func:`~.validation.compiled` (which checks the schema itself and adds qsched's
formats) into an upper-case validator (``flavors.FLAVOR_UPDATE``). A request never
compiles anything.

How they are used: a handler reads the body (:func:`qsched.api.read_json`) and calls
:func:`~.validation.validate` with a validator; it returns the body or raises
:class:`qsched.exception.Invalid` with Nova's message ("Invalid input for
field/attribute ..."), the subschema's ``x-message`` as the explanation if it has one.
A body that changes by microversion is a tuple of ``(first microversion, validator)``,
latest first (``servers.SERVER_CREATE``, ``keypairs.KEYPAIR_CREATE``...):
:func:`~.validation.for_version` picks the one a request's microversion reads. A body
with several actions (``server_actions.SERVER_ACTIONS``, ``flavors.FLAVOR_ACTIONS``,
``aggregates.AGGREGATE_ACTIONS``) is a dict of validators by action name. What a
schema cannot say is checked in the handler, in the same words
(:func:`~.validation.field_error`, :func:`~.validation.query_int`).
"""
