-- Create a host aggregate with the next integer id.
-- KEYS[1]  the aggregate ids hash (routes the script to the cell's slot)
-- ARGV     prefix, uuid, name, availability zone ("" for none), now
local uuid, name, zone, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if redis.call("HEXISTS", K.aggregate_names, name) == 1 then
    return fail("aggregate_name_exists", {aggregate_name = name})
end
local id = redis.call("HINCRBY", K.aggregate_ids, "seq", 1)
local metadata = {}
if zone ~= "" then metadata.availability_zone = zone end
redis.call("HSET", K.aggregate(uuid), "id", id, "uuid", uuid, "name", name,
           "metadata", cjson.encode(metadata), "created_at", now)
redis.call("HSET", K.aggregate_ids, tostring(id), uuid)
redis.call("HSET", K.aggregate_names, name, uuid)
redis.call("INCR", K.aggregates_version)
return reply({id = id})
