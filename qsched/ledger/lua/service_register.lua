-- Make sure an agent's host has a compute service record, and return it. A new one is
-- enabled, not forced down, with the id given (a UUID) and the next integer id; an
-- existing one keeps what operators set. The zone is the agent's, as it starts now.
-- KEYS[1]  the service key
-- ARGV     prefix, host, id for a new record, availability zone ("" = none), now
local host, id, zone, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local skey = K.service(host)
if redis.call("EXISTS", skey) == 0 then
    local seq = redis.call("INCR", K.service_seq)
    redis.call("HSET", skey, "id", id, "seq", seq, "disabled", "0", "forced_down", "0",
               "created_at", now)
    redis.call("HSET", K.service_ids, id, host)
end
if zone ~= "" then
    redis.call("HSET", skey, "zone", zone)
else
    redis.call("HDEL", skey, "zone")
end
return reply(service_record(host))
