-- Reserve quota for an instance and record it in BUILD, as one step.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, project, record JSON {field: string}, cores, ram_mb,
--          default instances, default cores, default ram_mb, deadline, now, max_events,
--          flavor id, the flavor as stored when the caller read it ("" "": no check),
--          scheduling class, its definition JSON for agents ("" "": none),
--          server group ("" = none), how many servers a group may hold by default
--          (-1: no limit; the project's override wins), "1" if that limit is final
--          (the deployment's, given by the front door of several cells)
local uuid, project, record = ARGV[2], ARGV[3], cjson.decode(ARGV[4])
local cores, ram = tonumber(ARGV[5]), tonumber(ARGV[6])
local defaults = {ARGV[7], ARGV[8], ARGV[9]}
local deadline, now, max_events = ARGV[10], ARGV[11], ARGV[12]
local flavor_id, flavor_stored = ARGV[13], ARGV[14]
local class_name, class_definition = ARGV[15], ARGV[16]
local group, default_members, members_final = ARGV[17] or "", ARGV[18] or -1, ARGV[19]
local ikey = K.instance(uuid)
if redis.call("EXISTS", ikey) == 1 then
    return fail("instance_exists", {instance = uuid})
end
-- the front door gave up on this create (it answered 503) before it ran here
if redis.call("EXISTS", K.instance_abandoned(uuid)) == 1 then
    return fail("abandoned", {instance = uuid})
end
-- a caller that read the flavor earlier (a cache) learns here if it changed since
if flavor_id ~= "" and redis.call("HGET", K.flavors, flavor_id) ~= flavor_stored then
    return fail("flavor_changed", {flavor = flavor_id})
end
-- a member of a server group: the group exists and has room (Nova's server_group_members)
if group ~= "" then
    if redis.call("EXISTS", K.group(group)) == 0 then
        return fail("group_not_found", {group = group})
    end
    local group_limit = group_member_limit(project, default_members, members_final)
    if group_limit >= 0 and redis.call("SCARD", K.group_members(group)) >= group_limit then
        return fail("group_members_quota", {group = group, limit = group_limit})
    end
end
local refused = reserve_quota(project, uuid, cores, ram, defaults)
if refused then return refused end
-- agents consume only classes they know: make sure its class is known, every time
-- (a flavor written since drops its classes)
if class_name ~= "" then redis.call("HSETNX", K.classes, class_name, class_definition) end
-- the janitor publishes it unless its publish is confirmed
local outbox = record_instance(uuid, record, project, group, cores, ram, deadline, now, {},
                               max_events)
return reply({created = true, outbox = outbox})
