-- Append one entry to an instance's history, trimmed to the newest max_events, unless
-- its record is gone (archived, or never made): a late writer (an agent refusing a
-- stale request) must not leave a history that no record owns.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, the entry (JSON text, kept as it is), max_events
local uuid, entry, keep = ARGV[2], ARGV[3], tonumber(ARGV[4])
if redis.call("EXISTS", K.instance(uuid)) == 0 then return reply({added = false}) end
local key = K.instance_events(uuid)
local n = redis.call("RPUSH", key, entry)
if n > keep then
    redis.call("LTRIM", key, n - keep, -1)
    redis.call("HINCRBY", K.instance(uuid), "events_trimmed", n - keep)
end
return reply({added = true})
