-- Create a resource provider at generation 0.
-- KEYS[1]  the provider key
-- ARGV     prefix, uuid, name, parent uuid ("" = a root), now
local uuid, name, parent, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local rkey = P .. "rp:" .. uuid
if redis.call("EXISTS", rkey) == 1 then
    return fail("provider_exists", {field = "uuid", value = uuid})
end
if redis.call("HEXISTS", P .. "rp-names", name) == 1 then
    return fail("provider_exists", {field = "name", value = name})
end
local root = uuid
if parent ~= "" then
    root = redis.call("HGET", P .. "rp:" .. parent, "root")
    if not root then return fail("provider_not_found", {provider = parent}) end
    redis.call("SADD", P .. "rp:" .. parent .. ":children", uuid)
end
redis.call("HSET", rkey, "name", name, "generation", 0, "parent", parent, "root", root,
           "created_at", now)
redis.call("HSET", P .. "rp-names", name, uuid)
redis.call("SADD", P .. "rps", uuid)
return reply({generation = 0, root = root})
