-- The front door of several cells gives up on a server group whose create may not have
-- reached this cell (its API process died, or it was told 503): if the group is here,
-- say so (the front door keeps it); else leave a mark so that a create arriving late
-- refuses, in the same step as the look.
-- KEYS[1]  the group key
-- ARGV     prefix, uuid, mark TTL in seconds, now
local uuid, ttl_s, now = ARGV[2], ARGV[3], ARGV[4]
if redis.call("EXISTS", K.group(uuid)) == 1 then return reply({state = "present"}) end
redis.call("SET", K.group_abandoned(uuid), now, "EX", ttl_s)
return reply({state = "absent"})
