-- Replace a provider's traits or aggregates, guarded by its generation.
-- KEYS[1]  the provider key
-- ARGV     prefix, uuid, generation, "traits" or "aggregates", members...
local uuid, expected, kind = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local rkey = K.provider(uuid)
local gen = tonumber(redis.call("HGET", rkey, "generation"))
if not gen then return fail("provider_not_found", {provider = uuid}) end
if gen ~= expected then
    return fail("provider_conflict", {provider = uuid, expected = expected, current = gen})
end
local skey = ({traits = K.provider_traits, aggregates = K.provider_aggregates})[kind](uuid)
redis.call("DEL", skey)
for i = 5, #ARGV do redis.call("SADD", skey, ARGV[i]) end
if kind == "traits" then index_sharing(uuid) end
return reply({generation = redis.call("HINCRBY", rkey, "generation", 1)})
