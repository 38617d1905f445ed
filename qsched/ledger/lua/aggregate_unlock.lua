-- In the API keyspace of several cells: give back an aggregate's lock, if the token
-- given still holds it (one that expired may be another writer's now).
-- KEYS[1]  the aggregate's lock key
-- ARGV     prefix, token
if redis.call("GET", KEYS[1]) ~= ARGV[2] then return reply({released = false}) end
redis.call("DEL", KEYS[1])
return reply({released = true})
