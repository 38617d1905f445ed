-- A heartbeat's part for the zones: the host stays in the zones it serves until its
-- heartbeat expires, if its service takes boots (refresh_zones in lib.lua).
-- KEYS[1]  the service key
-- ARGV     prefix, host, when the heartbeat expires, now (seconds)
local host, expires, now = ARGV[2], ARGV[3], ARGV[4]
refresh_zones(host, expires, now)
return reply({})
