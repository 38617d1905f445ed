-- In the API keyspace of several cells: the next aggregate id, the same in every cell,
-- above the last one given here and above ``floor`` (the highest id any cell gave
-- itself, so that an id a cell made alone is never given again).
-- KEYS[1]  the aggregate sequence key
-- ARGV     prefix, floor
local id = math.max(tonumber(redis.call("GET", K.aggregate_seq) or 0), tonumber(ARGV[2])) + 1
redis.call("SET", K.aggregate_seq, id)
return reply({id = id})
