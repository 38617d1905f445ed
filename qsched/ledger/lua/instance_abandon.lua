-- The front door answered 503 for a boot whose create may or may not have run (a
-- timeout, a lost connection): make sure it never boots. No record yet: leave a mark
-- so that a create arriving late refuses. Waiting, unclaimed: end it DELETED (quota
-- back). Placed already (the janitor published it meanwhile): say where, and the
-- caller deletes it as a client would.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, reason, mark TTL in seconds, now, max_events
local uuid, reason, ttl_s, now, max_events = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "state", "project_id", "host", "node")
if not inst[1] then
    redis.call("SET", K.instance_abandoned(uuid), now, "EX", ttl_s)
    return reply({state = "absent"})
end
local host = inst[3] or ""
if inst[1] == "BUILD" and host == "" then
    end_instance(uuid, {project = inst[2], host = "", node = ""}, "DELETED", "", now,
                 max_events, {reason = reason})
    return reply({state = "DELETED"})
end
return reply({state = inst[1], host = host})
