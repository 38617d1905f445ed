-- Mark a placed instance (BUILD with a host, or ACTIVE) as being deleted by its
-- host's agent. Repeating it is harmless; it says which host and node to ask.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, now, max_events
local uuid, now, max_events = ARGV[2], ARGV[3], ARGV[4]
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "state", "host", "node", "task_state")
if not inst[1] then return fail("instance_not_found", {instance = uuid}) end
local host = inst[2] or ""
if (inst[1] ~= "BUILD" and inst[1] ~= "ACTIVE") or host == "" then
    return fail("not_waiting", {instance = uuid, state = inst[1], host = host})
end
if inst[4] ~= "deleting" then
    redis.call("HSET", ikey, "task_state", "deleting", "updated_at", now)
    redis.call("ZADD", K.host_deleting(host), "NX", now, uuid)
    add_event(uuid, now, "deleting", host, inst[3], {}, max_events)
end
return reply({host = host})
