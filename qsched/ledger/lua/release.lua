-- Drop an instance's allocations and its host so it can be placed again.
-- KEYS[1]  the instance key
-- ARGV     prefix, instance, host ("" = whichever), now, max_events, reason
local uuid, host, now, max_events, reason = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local ikey = P .. "inst:" .. uuid
local inst = redis.call("HMGET", ikey, "host", "node")
if host ~= "" and inst[1] ~= host then return reply({released = false}) end
local released = drop_allocations(uuid)
if inst[1] and inst[1] ~= "" then
    redis.call("HSET", ikey, "host", "", "node", "", "updated_at", now)
    if reason ~= "" then
        add_event(uuid, now, "released", inst[1], inst[2], {reason = reason}, max_events)
    end
    released = true
end
return reply({released = released})
