-- In the API keyspace of several cells: map a server group a cell made before it was
-- served with others (it has no mapping) to that cell and project, counted in its
-- project's groups, confirmed at once (the cell holds it). A project may end above
-- its ``server_groups`` limit, as Nova lets one after a limit is lowered: the reply
-- says so, nothing is refused. A group mapped already is left as it is.
-- KEYS[1]  the group's mapping key
-- ARGV     prefix, uuid, cell, project, how many groups a project may hold by default
--          (-1: no limit; the project's override and the default class win),
--          "1" to write ("0": say what it would do, write nothing)
local uuid, cell, project, write = ARGV[2], ARGV[3], ARGV[4], ARGV[6] == "1"
local limit = quota_limit(project, "server_groups", ARGV[5])
local owned = K.project_groups(project)
-- the project's groups before this one (a group counted but not mapped is not twice)
local held = redis.call("SCARD", owned) - redis.call("SISMEMBER", owned, uuid)
local found = redis.call("GET", K.group_cell(uuid))
if found then
    local mapped = cjson.decode(found)
    local same = mapped[1] == cell and mapped[2] == project
    return reply({state = same and "mapped" or "elsewhere", cell = mapped[1],
                  project = mapped[2], held = held, limit = limit})
end
if write then
    redis.call("SET", K.group_cell(uuid), cjson.encode({cell, project}))
    redis.call("SADD", owned, uuid)
end
return reply({state = "adopted", held = held, limit = limit})
