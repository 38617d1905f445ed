-- Create a host aggregate with the next integer id, or with the id given (the front
-- door of several cells gives every cell the same id and uuid), which then also moves
-- the cell's own sequence past it. With an id and uuid given that this cell already
-- holds together, it is there already: done (a copy made twice, by a retry or by
-- ``qsched-admin cells adopt`` beside the front door's create).
-- KEYS[1]  the aggregate ids hash (routes the script to the cell's slot)
-- ARGV     prefix, uuid, name, availability zone ("" for none), now (its creation time),
--          id ("": the next), metadata as JSON ("": none but the zone; a copy of an
--          aggregate of another cell gives all of it, its zone included)
local uuid, name, zone, now, given = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6] or ""
local given_metadata = ARGV[7] or ""

if given ~= "" and redis.call("HGET", K.aggregate_ids, given) == uuid then
    return reply({id = tonumber(given), existed = true})
end
if redis.call("HEXISTS", K.aggregate_names, name) == 1 then
    return fail("aggregate_name_exists", {aggregate_name = name})
end
local id
if given == "" then
    id = redis.call("HINCRBY", K.aggregate_ids, "seq", 1)
else
    if redis.call("HEXISTS", K.aggregate_ids, given) == 1 then
        return fail("aggregate_id_exists", {aggregate_id = given})
    end
    id = tonumber(given)
    if tonumber(redis.call("HGET", K.aggregate_ids, "seq") or 0) < id then
        redis.call("HSET", K.aggregate_ids, "seq", id)
    end
end
local metadata = {}
if given_metadata ~= "" then metadata = cjson.decode(given_metadata) end
if zone ~= "" then metadata.availability_zone = zone end
redis.call("HSET", K.aggregate(uuid), "id", id, "uuid", uuid, "name", name,
           "metadata", cjson.encode(metadata), "created_at", now)
redis.call("HSET", K.aggregate_ids, tostring(id), uuid)
redis.call("HSET", K.aggregate_names, name, uuid)
redis.call("INCR", K.aggregates_version)
return reply({id = id})
