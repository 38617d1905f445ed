-- Mark a claimed instance ACTIVE on the host that claimed it.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, host, node, now, max_events
local uuid, host, node, now, max_events = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "state", "host", "node", "task_state")
if not inst[1] then return fail("instance_not_found", {instance = uuid}) end
if inst[1] == "ACTIVE" and inst[2] == host and inst[3] == node then
    return reply({state = "ACTIVE", already = true})  -- a retry after a lost reply
end
if inst[1] ~= "BUILD" or inst[2] ~= host or inst[3] ~= node then
    return fail("not_waiting", {instance = uuid, state = inst[1], host = inst[2] or ""})
end
-- a delete asked for while it spawned stays asked for: its host's agent finishes it
local task = inst[4] == "deleting" and "deleting" or ""
redis.call("HSET", ikey, "state", "ACTIVE", "task_state", task, "launched_at", now,
           "updated_at", now)
redis.call("ZREM", K.deadlines, uuid)
outbox_drop(uuid)
unbuild(uuid, host)
add_event(uuid, now, "active", host, node, {}, max_events)
return reply({state = "ACTIVE"})
