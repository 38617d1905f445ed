-- Release the allocations of a consumer found on a host's provider when no live
-- instance of that host explains them (its record is gone, ended, or placed
-- elsewhere), in one step with the check: a claim racing with it cannot lose. A claim
-- held for a host (hold_claim in lib.lua) is explained: only release_held ends it. So
-- are both sides of a move under way (docs/moves.rst): the instance's on its move's
-- destination or source, the migration's consumer while its move has not ended.
-- KEYS[1]  the consumer key
-- ARGV     prefix, consumer, host, provider
local consumer, host, provider = ARGV[2], ARGV[3], ARGV[4]
local c = redis.call("HMGET", KEYS[1], "held_for", "migration")
if c[1] then return reply({released = false}) end
if c[2] then
    local m = redis.call("HMGET", K.migration(c[2]), "status", "source_compute", "dest_compute")
    if m[1] and not MOVE_FINAL[m[1]] and (m[2] == host or m[3] == host) then
        return reply({released = false})
    end
end
local inst = redis.call("HMGET", K.instance(consumer), "state", "host", "move_from",
                        "move_host")
if (inst[1] == "BUILD" or inst[1] == "ACTIVE")
        and (inst[2] == host or inst[3] == host or inst[4] == host) then
    return reply({released = false})
end
local raw = redis.call("HGET", KEYS[1], "allocs")
if not raw or not cjson.decode(raw)[provider] then
    return reply({released = false})  -- it changed meanwhile
end
drop_allocations(consumer)
return reply({released = true})
