-- Add a host to an aggregate, or remove it. The caller then mirrors the change into
-- the host's root providers (provider_mirror); a registering agent merges the host's
-- aggregates into its providers itself, so nothing is lost between the two.
-- KEYS[1]  the aggregate ids hash (routes the script to the cell's slot)
-- ARGV     prefix, id, host, "add" or "remove", now
local id, host, op, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local uuid = aggregate_uuid(id)
if not uuid then return fail("aggregate_not_found", {aggregate_id = id}) end
local member = redis.call("SISMEMBER", K.aggregate_hosts(uuid), host) == 1

if op == "add" then
    if not redis.call("ZSCORE", K.agents, host) then
        return fail("compute_host_not_found", {host = host})
    end
    if member then return fail("aggregate_host_exists", {aggregate_id = id, host = host}) end
    local zone = aggregate_metadata(uuid).availability_zone
    if zone then
        local conflicts = zone_conflicts({host}, zone, uuid)
        if conflicts ~= "" then
            return fail("invalid_aggregate_action", {action = "add host to aggregate",
                aggregate_id = id,
                reason = "One or more hosts already in availability zone(s) " .. conflicts})
        end
    end
    redis.call("SADD", K.aggregate_hosts(uuid), host)
    redis.call("SADD", K.host_aggregates(host), uuid)
else
    if not member then
        return fail("aggregate_host_not_found", {aggregate_id = id, host = host})
    end
    redis.call("SREM", K.aggregate_hosts(uuid), host)
    redis.call("SREM", K.host_aggregates(host), uuid)
end
redis.call("HSET", K.aggregate(uuid), "updated_at", now)
redis.call("INCR", K.aggregates_version)
return reply({uuid = uuid})
