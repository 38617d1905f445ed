-- Put a waiting instance's request in the outbox, for the janitor to publish again
-- after its grace: a request hosts keep refusing waits there instead of going round.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, host that parked it, reason, now, max_events
local uuid, host, reason, now, max_events = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local inst = redis.call("HMGET", K.instance(uuid), "state", "host")
if inst[1] ~= "BUILD" or (inst[2] and inst[2] ~= "") then
    return reply({parked = false})
end
outbox_add(uuid)
add_event(uuid, now, "parked", host, nil, {reason = reason}, max_events)
return reply({parked = true})
