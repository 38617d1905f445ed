-- Release the allocations of a consumer found on a host's provider when no live
-- instance of that host explains them (its record is gone, ended, or placed
-- elsewhere), in one step with the check: a claim racing with it cannot lose. A claim
-- held for a host (hold_claim in lib.lua) is explained: only release_held ends it.
-- KEYS[1]  the consumer key
-- ARGV     prefix, consumer, host, provider
local consumer, host, provider = ARGV[2], ARGV[3], ARGV[4]
if redis.call("HEXISTS", KEYS[1], "held_for") == 1 then
    return reply({released = false})
end
local inst = redis.call("HMGET", K.instance(consumer), "state", "host")
if (inst[1] == "BUILD" or inst[1] == "ACTIVE") and inst[2] == host then
    return reply({released = false})
end
local raw = redis.call("HGET", KEYS[1], "allocs")
if not raw or not cjson.decode(raw)[provider] then
    return reply({released = false})  -- it changed meanwhile
end
drop_allocations(consumer)
return reply({released = true})
