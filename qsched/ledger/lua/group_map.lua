-- In the API keyspace of several cells: map a new server group to the cell that will
-- hold it, within its project's limit on groups across every cell, and mark it pending
-- until that cell confirms it. The API keyspace counts a project's groups (a joined
-- cell counts none), so the limit holds across cells in this one step.
-- KEYS[1]  the group's mapping key
-- ARGV     prefix, uuid, cell, project, how many groups a project may hold by default
--          (-1: no limit; the project's override and the default class win), now
local uuid, cell, project, now = ARGV[2], ARGV[3], ARGV[4], ARGV[6]
local limit = quota_limit(project, "server_groups", ARGV[5])
local mkey = K.group_cell(uuid)
if redis.call("EXISTS", mkey) == 1 then return fail("group_exists", {group = uuid}) end
local owned = K.project_groups(project)
if limit >= 0 and redis.call("SCARD", owned) >= limit then
    return fail("group_quota", {project = project, limit = limit})
end
redis.call("SET", mkey, cjson.encode({cell, project}))
redis.call("SADD", owned, uuid)
redis.call("ZADD", K.group_mapping_pending, now, uuid)
return reply({mapped = true})
