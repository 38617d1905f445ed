"""JSON Schemas (draft 2020-12) of what ``qsched-admin ... --format json`` prints.

The contract for scripts: the tests validate every command's JSON against
these, so a change of shape shows up as a failing test and a change here.
Objects list every key they have (``additionalProperties`` is false) except
free-form details (event details, message headers, counters).
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUMBER: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
ANY_OBJECT: Schema = {"type": "object"}


def maybe(schema: Schema) -> Schema:
    """``schema`` or null."""
    return {"anyOf": [schema, {"type": "null"}]}


def obj(**properties: Schema) -> Schema:
    """An object with exactly these keys."""
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        "additionalProperties": False,
    }


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def map_of(values: Schema) -> Schema:
    return {"type": "object", "additionalProperties": values}


FREE = obj(amount=INT, provider=STRING)

QUEUE_ROW = obj(
    queue=STRING,
    **{"class": maybe(STRING)},
    exists=BOOL,
    ready=maybe(INT),
    unacked=maybe(INT),
    consumers=maybe(INT),
    agents=maybe(INT),
    waiting=maybe(INT),
    oldest_s=maybe(NUMBER),
)
QUEUES = array(QUEUE_ROW)

AGENTS = array(
    obj(
        host=STRING,
        alive=BOOL,
        last_seen=NUMBER,
        age_s=NUMBER,
        nodes=INT,
        classes=array(STRING),
        building=maybe(INT),
        counters=map_of(INT),
        free=map_of(INT),
        largest_free=map_of(FREE),
    )
)

ZONES = array(obj(zone=STRING, agents=INT))

INVENTORY = obj(
    total=INT,
    reserved=INT,
    min_unit=INT,
    max_unit=INT,
    step_size=INT,
    allocation_ratio=NUMBER,
    capacity=INT,
)
_PROVIDER_FIELDS: dict[str, Schema] = {
    "uuid": STRING,
    "name": STRING,
    "host": maybe(STRING),
    "generation": INT,
    "parent_uuid": maybe(STRING),
    "root_uuid": maybe(STRING),
    "inventories": map_of(INVENTORY),
    "usages": map_of(INT),
    "traits": array(STRING),
    "aggregates": array(STRING),
    "sharing": BOOL,  # trait MISC_SHARES_VIA_AGGREGATE: a shared provider, no host's
}
PROVIDERS = array(obj(**_PROVIDER_FIELDS, depth=INT))
PROVIDER = obj(**_PROVIDER_FIELDS, consumers=array(STRING))
_SHARED = obj(**_PROVIDER_FIELDS, aggregate_names=array(maybe(STRING)), consumers=INT)
SHARED_PROVIDERS = array(_SHARED)  # shared-provider list
SHARED_PROVIDER = _SHARED  # shared-provider create

ALLOCATIONS = obj(
    consumer=STRING,
    generation=INT,
    project_id=maybe(STRING),
    user_id=maybe(STRING),
    allocations=array(
        obj(provider=STRING, provider_name=maybe(STRING), resource_class=STRING, amount=INT)
    ),
)

QUOTA_ROWS = array(obj(resource=STRING, used=INT, limit=INT))
QUOTA = obj(project_id=STRING, resources=QUOTA_ROWS)
USAGES = obj(
    project_id=STRING,
    usages=array(obj(resource_class=STRING, used=INT)),
    quota=QUOTA_ROWS,
)

_SERVER_FIELDS: dict[str, Schema] = {
    "uuid": STRING,
    "name": STRING,
    "project_id": STRING,
    "state": {"enum": ["BUILD", "ACTIVE", "ERROR", "DELETED"]},
    "task_state": maybe(STRING),
    "host": maybe(STRING),
    "node": maybe(STRING),
    "scheduling_class": STRING,
    "attempts": INT,
    "created_at": NUMBER,
}
SERVERS = array(obj(**_SERVER_FIELDS, flavor=maybe(STRING)))

EVENT = obj(
    time=NUMBER,
    event=STRING,
    host=maybe(STRING),
    node=maybe(STRING),
    detail=ANY_OBJECT,
    text=STRING,
)
SERVER = obj(
    **_SERVER_FIELDS,
    user_id=STRING,
    flavor=ANY_OBJECT,
    fault=maybe(ANY_OBJECT),
    updated_at=NUMBER,
    launched_at=maybe(NUMBER),
    deadline=maybe(NUMBER),
    quota=maybe(obj(instances=INT, cores=INT, ram_mb=INT)),
    extra=ANY_OBJECT,
    events_trimmed=INT,
    events=array(EVENT),
)

FIT = obj(
    nodes=INT,
    demand=map_of(INT),
    fitting_nodes=INT,
    fitting_sample=array(STRING),
    refusals=map_of(obj(nodes=INT, sample=STRING)),
    largest_free=map_of(FREE),
    short=array(obj(resource_class=STRING, needed=INT, largest_free=maybe(FREE))),
    zone_checked=BOOL,
)
_FACT: dict[str, Schema] = {"time": NUMBER, "host": maybe(STRING), "node": maybe(STRING)}
WHY = obj(
    uuid=STRING,
    name=STRING,
    project_id=STRING,
    state={"enum": ["BUILD", "ACTIVE", "ERROR", "DELETED"]},
    task_state=maybe(STRING),
    host=maybe(STRING),
    node=maybe(STRING),
    flavor=ANY_OBJECT,
    scheduling_class=STRING,
    attempts=INT,
    max_attempts=INT,
    created_at=NUMBER,
    deadline=maybe(NUMBER),
    outcome={"enum": ["placed", "spawning", "waiting", "error", "deleting", "deleted"]},
    verdict=STRING,
    history=array(EVENT),
    events_trimmed=INT,
    refusals=array(obj(**_FACT, reason=maybe(STRING), kind=maybe(STRING))),
    conflicts=array(obj(**_FACT, reason=maybe(STRING))),
    spawn_failures=array(obj(**_FACT, reason=maybe(STRING), attempts=maybe(INT))),
    tried_hosts=array(STRING),
    handbacks=INT,
    hand_backs=array(obj(**_FACT, alternate=maybe(STRING), handbacks=maybe(INT))),
    fault=maybe(ANY_OBJECT),
    now=maybe(
        obj(
            scheduling_class=STRING,
            live_agents=INT,
            consumers=array(STRING),
            fit=maybe(FIT),
            explanation=STRING,
        )
    ),
    server_group=maybe(
        obj(
            uuid=STRING,
            policy=STRING,
            max_server_per_host=maybe(INT),
            hosts=map_of(INT),
            explanation=STRING,
        )
    ),
)

_LETTER_FIELDS: dict[str, Schema] = {
    "id": {"type": "string", "pattern": "^[0-9a-f]{12}$"},
    "dead_at": maybe(NUMBER),
    "age_s": maybe(NUMBER),
    "queue": maybe(STRING),
    "class": maybe(STRING),
    "reason": STRING,
    "kind": maybe({"enum": ["boot", "delete"]}),
    "instance": maybe(STRING),
    "bytes": INT,
}
DEAD_LETTERS = array(obj(**_LETTER_FIELDS))
DEAD_LETTER = obj(
    **_LETTER_FIELDS,
    routing_key=maybe(STRING),
    problem=maybe(STRING),
    message=maybe(ANY_OBJECT),
    body_hex=maybe(STRING),
    headers=ANY_OBJECT,
)
OUTCOMES = array(obj(id=STRING, instance=maybe(STRING), result=STRING))

FLAVOR = obj(
    id=STRING,
    name=STRING,
    vcpus=INT,
    ram_mb=INT,
    disk_gb=INT,
    extra_specs=map_of(STRING),
    is_public=BOOL,
)
FLAVORS = array(FLAVOR)
SERVICE = obj(
    seq=INT,
    uuid=STRING,
    host=STRING,
    binary={"const": "nova-compute"},
    zone=maybe(STRING),
    status={"enum": ["enabled", "disabled"]},
    state={"enum": ["up", "down"]},
    forced_down=BOOL,
    reported_at=maybe(NUMBER),
    disabled_reason=maybe(STRING),
)
SERVICES = array(SERVICE)

TOP_FRAME = obj(
    time=NUMBER,
    interval_s=maybe(NUMBER),
    agents_alive=INT,
    agents=INT,
    building=INT,
    placements_per_s=maybe(NUMBER),
    refusals_per_s=maybe(NUMBER),
    fill=maybe(map_of(maybe(NUMBER))),
    queues=array({**QUEUE_ROW, "properties": {**QUEUE_ROW["properties"],
                                              "rate_per_s": maybe(NUMBER)},
                  "required": [*QUEUE_ROW["required"], "rate_per_s"]}),
)  # fmt: skip

# The janitor's report is qsched.recovery.janitor's: its known keys, and room for more.
JANITOR = {
    "type": "object",
    "properties": {
        "dead_agents": array(STRING),
        "requeued": array(STRING),
        "ended": array(STRING),
        "failed": array(STRING),
        "published": array(STRING),
        "dry_run": BOOL,
    },
    "required": ["dead_agents", "requeued", "dry_run"],
}

ARCHIVE = obj(
    before=NUMBER,
    dry_run=BOOL,
    batch=INT,
    max_rows=maybe(INT),
    archived=INT,
    recovered=INT,
    unmapped=maybe(INT),
    held=INT,
    held_named=map_of(STRING),
    stale=INT,
    steps=INT,
    left=INT,
    complete=BOOL,
    seconds=NUMBER,
)
#: archive-deleted --all-cells: each cell's run, in the order of the [cells] cell lines
ARCHIVE_CELLS = obj(
    cells=array(obj(cell=STRING, report=maybe(ARCHIVE), error=maybe(STRING))),
)
#: cells adopt (qsched.cells.adopt.AdoptReport.to_dict); what became of an aggregate's copy
ADOPT_RESULTS = ("would copy", "copied", "busy", "changed meanwhile", "passed over")
_ADOPT_AGGREGATE = obj(cell=STRING, id=INT, uuid=STRING, name=STRING)
ADOPT = obj(
    dry_run=BOOL,
    cells=array(
        obj(
            cell=STRING,
            groups=INT,
            groups_adopted=INT,
            hosts=INT,
            hosts_mapped=INT,
            error=maybe(STRING),
        )
    ),
    groups=array(obj(uuid=STRING, name=STRING, project_id=STRING, cell=STRING)),
    groups_elsewhere=array(
        obj(
            uuid=STRING,
            project_id=STRING,
            cell=STRING,
            mapped_cell=STRING,
            mapped_project=STRING,
            fix=STRING,
        )
    ),
    over_limit=array(obj(project_id=STRING, server_groups=INT, limit=INT)),
    hosts_elsewhere=array(obj(host=STRING, cell=STRING, mapped_cell=STRING)),
    aggregates=array(
        obj(
            id=INT,
            uuid=STRING,
            name=STRING,
            source=STRING,
            into=array(STRING),
            result={"enum": list(ADOPT_RESULTS)},
        )
    ),
    collisions=array(
        obj(kind={"enum": ["id", "name"]}, aggregates=array(_ADOPT_AGGREGATE), fix=STRING)
    ),
    aggregate_seq={**obj(before=INT, after=INT), "required": []},
    complete=BOOL,
    seconds=NUMBER,
)
#: one line of archive-deleted's history (qsched.admin.archive.history_line)
HISTORY_LINE = obj(
    uuid=STRING,
    project_id=STRING,
    deleted_at=NUMBER,
    archived_at=NUMBER,
    record={**ANY_OBJECT, "required": ["uuid", "state", "flavor", "created_at"]},
    events=array({**ANY_OBJECT, "required": ["t", "event"]}),
)
