-- Take the instances whose boot request has waited longer than grace to be published:
-- each is returned with its new score (now), so that another janitor sees it only
-- after another grace, and the caller clears it after its publish is confirmed.
-- KEYS[1]  the outbox key
-- ARGV     prefix, grace in seconds, how many at most
local grace, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = server_now()
local due = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", now - grace, "LIMIT", 0, limit)
local taken = {}
for _, uuid in ipairs(due) do
    taken[#taken + 1] = {uuid, outbox_add(uuid)}
end
return reply({taken = taken})
