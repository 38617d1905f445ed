-- Say which scheduling classes an agent has room for now, replacing what it said
-- before. Each class keeps the set of its consumers, so that a claim can tell in a few
-- commands whether a host that has not tried a request could take it (allocate.lua).
-- KEYS[1]  the agent's classes key
-- ARGV     prefix, host, the class names (none: it consumes nothing)
local host = ARGV[2]
local mine = K.agent_classes(host)
local wanted = {}
for i = 3, #ARGV do wanted[ARGV[i]] = true end
for _, name in ipairs(redis.call("SMEMBERS", mine)) do
    if not wanted[name] then
        redis.call("SREM", K.class_consumers(name), host)
        redis.call("SREM", mine, name)
    end
end
for i = 3, #ARGV do
    redis.call("SADD", K.class_consumers(ARGV[i]), host)
    redis.call("SADD", mine, ARGV[i])
end
return reply({classes = #ARGV - 2})
