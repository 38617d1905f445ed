-- Create a server group, within its project's limit on groups.
-- KEYS[1]  the group key
-- ARGV     prefix, uuid, project, record JSON {field: string}, how many groups a
--          project may hold by default (-1: no limit; the project's override wins)
local uuid, project, record = ARGV[2], ARGV[3], cjson.decode(ARGV[4])
local limit = quota_limit(project, "server_groups", ARGV[5])
local gkey = K.group(uuid)
if redis.call("EXISTS", gkey) == 1 then return fail("group_exists", {group = uuid}) end
-- the front door of several cells gave up on this create before it ran here
if redis.call("EXISTS", K.group_abandoned(uuid)) == 1 then
    return fail("group_abandoned", {group = uuid})
end
local owned = K.project_groups(project)
if limit >= 0 and redis.call("SCARD", owned) >= limit then
    return fail("group_quota", {project = project, limit = limit})
end
local fields = {}
for field, value in pairs(record) do
    fields[#fields + 1] = field
    fields[#fields + 1] = value
end
redis.call("HSET", gkey, unpack(fields))
redis.call("SADD", owned, uuid)
redis.call("SADD", K.groups, uuid)
return reply({created = true})
