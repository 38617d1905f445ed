-- An operator enables or disables a compute service (with a reason) or forces it down
-- or up. What is "" is left as it is. Enabling clears the reason.
-- KEYS[1]  the service key
-- ARGV     prefix, host, disabled ("1", "0" or ""), reason ("" = none), forced_down
--          ("1", "0" or ""), now
local host, disabled, reason, forced, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local skey = K.service(host)
if redis.call("EXISTS", skey) == 0 then return fail("service_not_found", {host = host}) end
if disabled == "1" then
    redis.call("HSET", skey, "disabled", "1")
    if reason ~= "" then
        redis.call("HSET", skey, "disabled_reason", reason)
    else
        redis.call("HDEL", skey, "disabled_reason")
    end
elseif disabled == "0" then
    redis.call("HSET", skey, "disabled", "0")
    redis.call("HDEL", skey, "disabled_reason")
end
if forced ~= "" then redis.call("HSET", skey, "forced_down", forced) end
redis.call("HSET", skey, "updated_at", now)
-- the zones it serves see the change at once, not at its next heartbeat
local ttl_ms = redis.call("PTTL", K.agent(host))
refresh_zones(host, ttl_ms > 0 and string.format("%.6f", tonumber(now) + ttl_ms / 1000) or nil, now)
return reply(service_record(host))
