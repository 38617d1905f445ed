-- Boot requests published and confirmed: clear their outbox entries, but only those
-- still at the score the publisher knew (a requeue since then waits for its own).
-- KEYS[1]  the outbox key
-- ARGV     prefix, then pairs of uuid and score
local cleared = 0
for i = 2, #ARGV, 2 do
    local score = redis.call("ZSCORE", KEYS[1], ARGV[i])
    if score and tonumber(score) == tonumber(ARGV[i + 1]) then
        redis.call("ZREM", KEYS[1], ARGV[i])
        cleared = cleared + 1
    end
end
return reply({cleared = cleared})
