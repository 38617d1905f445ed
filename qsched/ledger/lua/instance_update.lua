-- Change what a client may change of a server's record, where the record lives: its
-- name, and items of the maps in its extra (the boot details: the server's fields
-- under "server", its metadata), each item set or removed in the map as it is now,
-- so that concurrent changes of other items all land. Nothing is written if the
-- record is DELETED, or if a map would hold more items than its limit.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, now, "1" if the name changes ("" if not), the name, then for
--          each map: its key in extra, "1" to replace it whole ("" to change it), its
--          limit (-1: none), how many items to set and keys to remove, the items (key,
--          value, ...), the keys. Keys and values are JSON text (see lib.lua).
local uuid, now = ARGV[2], ARGV[3]
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "state", "extra")
if not inst[1] or inst[1] == "DELETED" then
    return fail("instance_not_found", {instance = uuid})
end
local extra = json_members(inst[2] or "{}") or {}
local i = 6
while i <= #ARGV do
    local key, replace, limit = ARGV[i], ARGV[i + 1] == "1", tonumber(ARGV[i + 2])
    local set_end = i + 4 + 2 * tonumber(ARGV[i + 3])
    local removed_end = set_end + tonumber(ARGV[i + 4])
    local map = (not replace and extra[key] and json_members(extra[key])) or {}
    for j = i + 5, set_end, 2 do map[ARGV[j]] = ARGV[j + 1] end
    for j = set_end + 1, removed_end do map[ARGV[j]] = nil end
    local text, items = json_object(map)
    if limit >= 0 and items > limit then
        return fail("item_limit", {name = string.sub(key, 2, -2), items = items, limit = limit})
    end
    extra[key] = text
    i = removed_end + 1
end
local fields = {"updated_at", now, "extra", (json_object(extra))}
if ARGV[4] == "1" then
    fields[#fields + 1] = "name"
    fields[#fields + 1] = ARGV[5]
end
redis.call("HSET", ikey, unpack(fields))
return reply({updated = true})
