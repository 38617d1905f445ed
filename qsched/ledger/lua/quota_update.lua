-- Override some of a project's limits, all or none, checked against what it holds in
-- the same step (so a boot between the check and the write cannot slip under it).
-- KEYS[1]  the project's quota limits key
-- ARGV     prefix, project, force ("1": no check), then name, limit pairs (-1: none)
local project, force = ARGV[2], ARGV[3] == "1"
-- what the ledger counts, by the name a limit has; the reply names it as Nova does
local counted = {instances = "instances", cores = "cores", ram_mb = "ram"}
local changes = {}
for i = 4, #ARGV, 2 do
    local name, limit = ARGV[i], tonumber(ARGV[i + 1])
    if not force and limit >= 0 then
        local used = 0
        if counted[name] then
            used = tonumber(redis.call("HGET", K.quota_used(project), name) or 0)
        elseif name == "server_groups" then
            used = redis.call("SCARD", K.project_groups(project))
        end
        if limit < used then
            return fail("quota_below_usage", {resource = counted[name] or name, limit = limit,
                                              minimum = used})
        end
    end
    changes[#changes + 1] = name
    changes[#changes + 1] = limit
end
if #changes > 0 then redis.call("HSET", K.quota_limits(project), unpack(changes)) end
return reply({updated = #changes / 2})
