-- Create a resource provider at generation 0.
-- KEYS[1]  the provider key
-- ARGV     prefix, uuid, name, parent uuid ("" = a root), now
local uuid, name, parent, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local rkey = K.provider(uuid)
if redis.call("EXISTS", rkey) == 1 then
    return fail("provider_exists", {field = "uuid", value = uuid})
end
if redis.call("HEXISTS", K.provider_names, name) == 1 then
    return fail("provider_exists", {field = "name", value = name})
end
local root = uuid
if parent ~= "" then
    root = redis.call("HGET", K.provider(parent), "root")
    if not root then return fail("provider_not_found", {provider = parent}) end
    redis.call("SADD", K.provider_children(parent), uuid)
end
redis.call("HSET", rkey, "name", name, "generation", 0, "parent", parent, "root", root,
           "created_at", now)
redis.call("HSET", K.provider_names, name, uuid)
redis.call("SADD", K.providers, uuid)
return reply({generation = 0, root = root})
