-- Record a multi-create: quota for as many members as allowed between min_count and
-- max_count (as Nova), each recorded BUILD as instance_create does, and, for more than
-- one, the batch they are placed as: every member claimed before any spawns, or none.
-- KEYS[1]  the batch key
-- ARGV     prefix, reservation id, project, records JSON [{field: string}] (max_count of
--          them, named <name>-<n>), cores, ram_mb, default instances, cores, ram_mb,
--          deadline, now, max_events, flavor id, the flavor as stored ("" "": no check),
--          scheduling class, its definition JSON ("" "": none), server group ("" = none),
--          its default member limit (-1: none; the project's override wins), min_count,
--          the name of a lone member, how long the batch is kept (s), "1" if the member
--          limit is final (the deployment's, given by the front door of several cells)
local batch, project, records = ARGV[2], ARGV[3], cjson.decode(ARGV[4])
local cores, ram = tonumber(ARGV[5]), tonumber(ARGV[6])
local defaults = {ARGV[7], ARGV[8], ARGV[9]}
local deadline, now, max_events = ARGV[10], ARGV[11], ARGV[12]
local flavor_id, flavor_stored = ARGV[13], ARGV[14]
local class_name, class_definition = ARGV[15], ARGV[16]
local group, default_members = ARGV[17], ARGV[18]
local min_count, lone_name, keep_s = tonumber(ARGV[19]), ARGV[20], tonumber(ARGV[21])
local members_final = ARGV[22]
local bkey = K.batch(batch)
if redis.call("EXISTS", bkey) == 1 then return fail("batch_exists", {batch = batch}) end
for _, record in ipairs(records) do
    if redis.call("EXISTS", K.instance(record.uuid)) == 1 then
        return fail("instance_exists", {instance = record.uuid})
    end
    if redis.call("EXISTS", K.instance_abandoned(record.uuid)) == 1 then
        return fail("abandoned", {instance = record.uuid})
    end
end
if flavor_id ~= "" and redis.call("HGET", K.flavors, flavor_id) ~= flavor_stored then
    return fail("flavor_changed", {flavor = flavor_id})
end

-- Nova's count: as many as every limit allows, at most max_count, at least min_count.
local limits = quota_limits(project, {"instances", "cores", "ram_mb"}, defaults)
local used = redis.call("HMGET", K.quota_used(project), "instances", "cores", "ram_mb")
local names, each = {"instances", "cores", "ram"}, {1, cores, ram}
local count, most = #records, #records
for i = 1, 3 do
    local limit, u = limits[i], tonumber(used[i] or 0)
    if limit >= 0 and each[i] > 0 then
        local fits = math.floor((limit - u) / each[i])
        if fits < min_count then
            local asked = i == 1 and (min_count == most and tostring(most)
                                      or min_count .. "-" .. most) or most * each[i]
            return fail("quota", {resource = names[i], requested = asked, used = u,
                                  limit = limit})
        end
        count = math.min(count, fits)
    end
end
if group ~= "" then
    if redis.call("EXISTS", K.group(group)) == 0 then
        return fail("group_not_found", {group = group})
    end
    local group_limit = group_member_limit(project, default_members, members_final)
    if group_limit >= 0 and redis.call("SCARD", K.group_members(group)) + count > group_limit then
        return fail("group_members_quota", {group = group, limit = group_limit})
    end
end

local outboxes = {}
for n = 1, count do
    local record = records[n]
    local uuid = record.uuid
    reserve_quota(project, uuid, cores, ram, defaults)  -- the count above leaves room
    if count == 1 then record.name = lone_name end
    if count > 1 then record.batch = batch end
    outboxes[n] = record_instance(uuid, record, project, group, cores, ram, deadline, now,
                                  {batch = batch}, max_events)
    if count > 1 then redis.call("SADD", K.batch_members(batch), uuid) end
end
if class_name ~= "" then redis.call("HSETNX", K.classes, class_name, class_definition) end
if count > 1 then
    redis.call("HSET", bkey, "state", "waiting", "size", count, "claimed", 0,
               "project_id", project)
    redis.call("EXPIRE", bkey, keep_s)
    redis.call("EXPIRE", K.batch_members(batch), keep_s)
end
return reply({count = count, outboxes = outboxes})
