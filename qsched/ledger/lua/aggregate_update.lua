-- Rename an aggregate, move it to a zone, or set and remove metadata keys.
-- KEYS[1]  the aggregate ids hash (routes the script to the cell's slot)
-- ARGV     prefix, id, new name ("" keeps it), metadata changes JSON {key: value or
--          null to remove}, the action as Nova words its error ("update aggregate",
--          "update metadata of aggregate"), now
local id, name, changes, action, now = ARGV[2], ARGV[3], cjson.decode(ARGV[4]), ARGV[5], ARGV[6]

local uuid = aggregate_uuid(id)
if not uuid then return fail("aggregate_not_found", {aggregate_id = id}) end
local akey = K.aggregate(uuid)

-- Check everything before writing anything.
if name ~= "" then
    local owner = redis.call("HGET", K.aggregate_names, name)
    if owner and owner ~= uuid then
        return fail("aggregate_name_exists", {aggregate_name = name})
    end
end
local zone = changes.availability_zone
if zone ~= nil and zone ~= cjson.null then
    if zone == "" then
        return fail("invalid_aggregate_action", {action = action, aggregate_id = id,
            reason = "Aggregate " .. redis.call("HGET", akey, "name")
                .. " does not support empty named availability zone"})
    end
    local conflicts = zone_conflicts(redis.call("SMEMBERS", K.aggregate_hosts(uuid)), zone, uuid)
    if conflicts ~= "" then
        return fail("invalid_aggregate_action", {action = action, aggregate_id = id,
            reason = "One or more hosts already in availability zone(s) " .. conflicts})
    end
end

if name ~= "" then
    redis.call("HDEL", K.aggregate_names, redis.call("HGET", akey, "name"))
    redis.call("HSET", K.aggregate_names, name, uuid)
    redis.call("HSET", akey, "name", name)
end
local metadata = aggregate_metadata(uuid)
for key, value in pairs(changes) do
    if value == cjson.null then metadata[key] = nil else metadata[key] = value end
end
redis.call("HSET", akey, "metadata", cjson.encode(metadata), "updated_at", now)
redis.call("INCR", K.aggregates_version)
return reply({done = true})
