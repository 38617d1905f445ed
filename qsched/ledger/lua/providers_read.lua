-- Read providers whole in one round trip: hash, traits and aggregates of each.
-- Read only: no write, so no WAIT under [ledger] durability = replica.
-- KEYS[1]  the providers set (routes the script to the cell's slot)
-- ARGV     prefix, provider uuids...
-- Returns JSON, a list in the order of the uuids: [hash fields and values, traits,
-- aggregates] for a provider, 0 for one that does not exist. (An empty Lua table
-- encodes as {}: the reader takes it for an empty list.)
local found = {}
for i = 2, #ARGV do
    local uuid = ARGV[i]
    local fields = redis.call("HGETALL", K.provider(uuid))
    if #fields == 0 then
        found[i - 1] = 0
    else
        found[i - 1] = {fields, redis.call("SMEMBERS", K.provider_traits(uuid)),
                        redis.call("SMEMBERS", K.provider_aggregates(uuid))}
    end
end
return cjson.encode(found)
