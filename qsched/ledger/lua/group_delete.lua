-- Delete a server group. Its servers live on, in no group (as in Nova): a claim then
-- keeps no rule of it, and dropping a claim counted on it changes nothing.
-- KEYS[1]  the group key
-- ARGV     prefix, uuid
local uuid = ARGV[2]
local gkey = K.group(uuid)
local project = redis.call("HGET", gkey, "project_id")
if not project then return fail("group_not_found", {group = uuid}) end
redis.call("DEL", gkey, K.group_members(uuid), K.group_hosts(uuid))
redis.call("SREM", K.project_groups(project), uuid)
redis.call("SREM", K.groups, uuid)
return reply({deleted = true})
