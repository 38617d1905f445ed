-- End an instance: ERROR (only from BUILD) or DELETED (from anything), releasing
-- its allocations and its quota.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, "ERROR" or "DELETED", fault JSON ("" = none), now, max_events
local uuid, state, fault, now, max_events = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local ikey = P .. "inst:" .. uuid
local inst = redis.call("HMGET", ikey, "state", "project_id", "host", "node")
if not inst[1] then return fail("instance_not_found", {instance = uuid}) end
if inst[1] == "DELETED" or (state == "ERROR" and inst[1] ~= "BUILD") then
    return reply({changed = false})
end
drop_allocations(uuid)
release_quota(inst[2], uuid)
unbuild(uuid, inst[3])
undelete(uuid, inst[3])
redis.call("HSET", ikey, "state", state, "task_state", "", "updated_at", now)
redis.call("HDEL", ikey, "quota")
if fault ~= "" then redis.call("HSET", ikey, "fault", fault) end
if state == "DELETED" then
    redis.call("HSET", ikey, "deleted_at", now)
    redis.call("SREM", P .. "project:" .. inst[2] .. ":instances", uuid)
end
redis.call("ZREM", P .. "deadlines", uuid)
add_event(uuid, now, string.lower(state), inst[3], inst[4], {}, max_events)
return reply({changed = true})
