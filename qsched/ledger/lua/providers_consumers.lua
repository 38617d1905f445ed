-- The consumers of providers, in one round trip. Read only.
-- KEYS[1]  the providers set (routes the script to the cell's slot)
-- ARGV     prefix, provider uuids...
-- Returns JSON, a list in the order of the uuids: each provider's consumer uuids
-- ({} for none: an empty Lua table encodes as an object).
local found = {}
for i = 2, #ARGV do
    found[i - 1] = redis.call("SMEMBERS", K.provider_consumers(ARGV[i]))
end
return cjson.encode(found)
