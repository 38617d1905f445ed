-- End an instance: ERROR (only from BUILD) or DELETED (from anything), releasing
-- its allocations and its quota.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, "ERROR" or "DELETED", fault JSON ("" = none), now, max_events
local uuid, state, fault, now, max_events = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local inst = redis.call("HMGET", K.instance(uuid), "state", "project_id", "host", "node")
if not inst[1] then return fail("instance_not_found", {instance = uuid}) end
if inst[1] == "DELETED" or (state == "ERROR" and inst[1] ~= "BUILD") then
    return reply({changed = false})
end
end_instance(uuid, {project = inst[2], host = inst[3], node = inst[4]}, state, fault, now,
             max_events, {})
return reply({changed = true})
