-- Delete an aggregate that has no host.
-- KEYS[1]  the aggregate ids hash (routes the script to the cell's slot)
-- ARGV     prefix, id
local id = ARGV[2]

local uuid = aggregate_uuid(id)
if not uuid then return fail("aggregate_not_found", {aggregate_id = id}) end
if redis.call("SCARD", K.aggregate_hosts(uuid)) > 0 then
    return fail("invalid_aggregate_action", {action = "remove host from aggregate",
        aggregate_id = id, reason = "Host aggregate is not empty"})
end
redis.call("HDEL", K.aggregate_names, redis.call("HGET", K.aggregate(uuid), "name"))
redis.call("HDEL", K.aggregate_ids, id)
redis.call("DEL", K.aggregate(uuid))
redis.call("INCR", K.aggregates_version)
return reply({done = true})
