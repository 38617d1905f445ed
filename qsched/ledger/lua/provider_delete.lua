-- Delete a provider without allocations or children, guarded by its generation.
-- KEYS[1]  the provider key
-- ARGV     prefix, uuid, generation
local uuid, expected = ARGV[2], tonumber(ARGV[3])
local rkey = K.provider(uuid)
local info = redis.call("HMGET", rkey, "generation", "name", "parent")
local gen = tonumber(info[1])
if not gen then return fail("provider_not_found", {provider = uuid}) end
if gen ~= expected then
    return fail("provider_conflict", {provider = uuid, expected = expected, current = gen})
end
if redis.call("SCARD", K.provider_consumers(uuid)) > 0 then
    return fail("provider_in_use", {provider = uuid, reason = "allocations"})
end
if redis.call("SCARD", K.provider_children(uuid)) > 0 then
    return fail("provider_in_use", {provider = uuid, reason = "child providers"})
end
redis.call("DEL", rkey, K.provider_traits(uuid), K.provider_aggregates(uuid),
           K.provider_consumers(uuid), K.provider_children(uuid))
redis.call("HDEL", K.provider_names, info[2])
redis.call("SREM", K.providers, uuid)
redis.call("SREM", K.sharing_providers, uuid)
redis.call("ZREM", K.hypervisors, uuid)
if info[3] ~= "" then redis.call("SREM", K.provider_children(info[3]), uuid) end
return reply({deleted = true})
