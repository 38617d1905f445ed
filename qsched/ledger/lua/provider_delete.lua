-- Delete a provider without allocations or children, guarded by its generation.
-- KEYS[1]  the provider key
-- ARGV     prefix, uuid, generation
local uuid, expected = ARGV[2], tonumber(ARGV[3])
local rkey = P .. "rp:" .. uuid
local info = redis.call("HMGET", rkey, "generation", "name", "parent")
local gen = tonumber(info[1])
if not gen then return fail("provider_not_found", {provider = uuid}) end
if gen ~= expected then
    return fail("provider_conflict", {provider = uuid, expected = expected, current = gen})
end
if redis.call("SCARD", rkey .. ":consumers") > 0 then
    return fail("provider_in_use", {provider = uuid, reason = "allocations"})
end
if redis.call("SCARD", rkey .. ":children") > 0 then
    return fail("provider_in_use", {provider = uuid, reason = "child providers"})
end
redis.call("DEL", rkey, rkey .. ":traits", rkey .. ":aggs", rkey .. ":consumers",
           rkey .. ":children")
redis.call("HDEL", P .. "rp-names", info[2])
redis.call("SREM", P .. "rps", uuid)
if info[3] ~= "" then redis.call("SREM", P .. "rp:" .. info[3] .. ":children", uuid) end
return reply({deleted = true})
