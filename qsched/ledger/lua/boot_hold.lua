-- In the API keyspace of several cells: hold a boot's instances in one step. For each
-- uuid in order, reserve its quota (as quota_reserve does) and map it to its cell and
-- project, pending until the cell holds it, until the deployment's limits refuse one.
-- Fewer held than min_count: nothing stays held or mapped, and the refusal is the reply.
-- KEYS[1]  the project's quota usage key (the API keyspace's slot)
-- ARGV     prefix, project, cell, cores, ram_mb, min_count, now,
--          default instances, default cores, default ram_mb, then the uuids
local project, cell, now = ARGV[2], ARGV[3], ARGV[7]
local cores, ram, min_count = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local defaults = {ARGV[8], ARGV[9], ARGV[10]}
local mapped = cjson.encode({cell, project})
local held, refused = {}, nil
for i = 11, #ARGV do
    local uuid = ARGV[i]
    refused = reserve_quota(project, uuid, cores, ram, defaults)
    if refused then break end
    redis.call("SET", K.instance_cell(uuid), mapped)
    redis.call("ZADD", K.mapping_pending, now, uuid)
    held[#held + 1] = uuid
end
if refused and #held < min_count then
    for _, uuid in ipairs(held) do
        release_quota(project, uuid)
        redis.call("DEL", K.instance_cell(uuid))
        redis.call("ZREM", K.mapping_pending, uuid)
    end
    return refused
end
return reply({held = held})
