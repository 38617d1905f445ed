-- Put an aggregate in providers, or take it out, as their host joined or left it.
-- A changed provider's generation is bumped, so a claim on an older view conflicts.
-- Removing keeps an aggregate the provider's agent registers itself ("own_aggs").
-- KEYS[1]  the providers set (routes the script to the cell's slot)
-- ARGV     prefix, aggregate uuid, "add" or "remove", JSON [provider uuid]
local agg, op, uuids = ARGV[2], ARGV[3], cjson.decode(ARGV[4])

local changed = 0
for _, rp in ipairs(uuids) do
    local rkey = K.provider(rp)
    if redis.call("EXISTS", rkey) == 1 then
        local n = 0
        if op == "add" then
            n = redis.call("SADD", K.provider_aggregates(rp), agg)
        else
            local own = cjson.decode(redis.call("HGET", rkey, "own_aggs") or "[]")
            local keep = false
            for _, a in ipairs(own) do if a == agg then keep = true end end
            if not keep then n = redis.call("SREM", K.provider_aggregates(rp), agg) end
        end
        if n > 0 then
            redis.call("HINCRBY", rkey, "generation", 1)
            changed = changed + 1
        end
    end
end
return reply({changed = changed})
