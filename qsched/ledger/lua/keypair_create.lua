-- Create a keypair of one user, within the user's limit on keypairs.
-- KEYS[1]  the user's keypairs hash
-- ARGV     prefix, user, name, keypair JSON {type, public_key, fingerprint, created_at},
--          how many keypairs a user may hold (-1: no limit)
local user, name, record, limit = ARGV[2], ARGV[3], cjson.decode(ARGV[4]), tonumber(ARGV[5])
local owned = K.user_keypairs(user)
if redis.call("HEXISTS", owned, name) == 1 then
    return fail("keypair_exists", {name = name})
end
if limit >= 0 and redis.call("HLEN", owned) >= limit then
    return fail("keypair_quota", {})
end
record.id = redis.call("INCR", K.keypair_seq)
redis.call("HSET", owned, name, cjson.encode(record))
return reply({id = record.id})
