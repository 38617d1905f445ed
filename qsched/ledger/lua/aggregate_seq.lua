-- In the API keyspace of several cells: the next aggregate id, the same in every cell,
-- above the last one given here and above ``floor`` (the highest id any cell gave
-- itself, so that an id a cell made alone is never given again). With ``step`` 0 it
-- gives none: the sequence is only raised to ``floor`` (``qsched-admin cells adopt``).
-- KEYS[1]  the aggregate sequence key
-- ARGV     prefix, floor, step ("1" when not given)
local before = tonumber(redis.call("GET", K.aggregate_seq) or 0)
local id = math.max(before, tonumber(ARGV[2])) + tonumber(ARGV[3] or 1)
if id ~= before then redis.call("SET", K.aggregate_seq, id) end
return reply({id = id, before = before})
