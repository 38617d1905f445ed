-- A heartbeat's part for the cell's free capacity (cell-free: resource class -> free
-- amount, summed over the agents that count). An agent counts while its heartbeat has
-- not expired and its service takes boots; its part is what it said it has free at its
-- last beat (free-by-agent), replaced at each beat. A part whose heartbeat expired is
-- taken out by whichever agent beats next (at most EXPIRED_PER_BEAT a beat), and an
-- agent that stops takes its own out. Idempotent: a beat run twice counts once.
-- KEYS[1]  the service key
-- ARGV     prefix, host, when its heartbeat expires ("": it stops), now (seconds),
--          then resource class, free amount pairs
local EXPIRED_PER_BEAT = 100
local host, expires, now = ARGV[2], ARGV[3], ARGV[4]

local function take_out(who)
    local part = redis.call("HGET", K.free_by_agent, who)
    if part then
        -- amounts stay text: Redis writes a Lua number such as 100 as "1e2", which
        -- HINCRBY refuses; a part is never below 0, so its negative is "-" .. n
        for rc, n in string.gmatch(part, "([^=,]+)=(%d+)") do
            if n ~= "0" then
                redis.call("HINCRBY", K.cell_free, rc, "-" .. n)
            end
        end
        redis.call("HDEL", K.free_by_agent, who)
    end
    redis.call("ZREM", K.free_expiry, who)
end

local expired = redis.call("ZRANGEBYSCORE", K.free_expiry, "-inf", "(" .. now,
                           "LIMIT", 0, EXPIRED_PER_BEAT)
for _, who in ipairs(expired) do
    take_out(who)
end
take_out(host)
if expires ~= "" and not service_closed(host) then
    local part = {}
    for i = 5, #ARGV, 2 do
        redis.call("HINCRBY", K.cell_free, ARGV[i], ARGV[i + 1])
        part[#part + 1] = ARGV[i] .. "=" .. ARGV[i + 1]
    end
    redis.call("HSET", K.free_by_agent, host, table.concat(part, ","))
    redis.call("ZADD", K.free_expiry, expires, host)
end
return reply({})
