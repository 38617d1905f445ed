-- Change what a client may change of a server's record: its name and the boot details
-- kept in ``extra`` (metadata, description...), unless it is DELETED.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, now, the ``extra`` JSON the caller read ("" = no check), then
--          field, value, ... (only "name" and "extra")
local uuid, now, expect = ARGV[2], ARGV[3], ARGV[4]
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "state", "extra")
if not inst[1] or inst[1] == "DELETED" then
    return fail("instance_not_found", {instance = uuid})
end
-- a read-modify-write of extra: someone else wrote it since the caller read it
if expect ~= "" and inst[2] ~= expect then
    return fail("instance_changed", {instance = uuid})
end
local fields = {"updated_at", now}
for i = 5, #ARGV, 2 do
    local field = ARGV[i]
    if field ~= "name" and field ~= "extra" then
        return fail("invalid_field", {field = field})
    end
    fields[#fields + 1] = field
    fields[#fields + 1] = ARGV[i + 1]
end
redis.call("HSET", ikey, unpack(fields))
return reply({updated = true})
