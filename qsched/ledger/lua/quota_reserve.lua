-- Reserve quota for a holder, or release it. A reservation returns the usage after,
-- so that the caller needs no second round trip to read it.
-- KEYS[1]  the project's quota usage key
-- ARGV     prefix, "reserve" or "release", project, holder, cores, ram_mb,
--          default instances, default cores, default ram_mb
local op, project, holder = ARGV[2], ARGV[3], ARGV[4]
if op == "release" then
    return reply({released = release_quota(project, holder)})
end
local refused = reserve_quota(project, holder, tonumber(ARGV[5]), tonumber(ARGV[6]),
                              {ARGV[7], ARGV[8], ARGV[9]})
if refused then return refused end
local used = redis.call("HMGET", KEYS[1], "instances", "cores", "ram_mb")
return reply({reserved = true, instances = used[1] or "0", cores = used[2] or "0",
              ram_mb = used[3] or "0"})
