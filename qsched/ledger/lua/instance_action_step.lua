-- A step of a server action by the agent of the instance's host: move its
-- task_state on (and its power with it) only if it is still where the action left
-- it, so a delete or a newer action that took over is never undone.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, host, expected task_state, new task_state, power ("on",
--          "off" or "" to keep), event ("" for none), event detail (JSON), shelved ("1":
--          shelved on its host from now on, "0": no longer, "": as it is), now,
--          max_events
-- Reply    {moved = false} when stepped, {moved = true, state, task_state} when not
local uuid, host, expect, to, power, event, detail, shelved, now, max_events =
    ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "state", "host", "node", "task_state")
if not inst[1] then return fail("instance_not_found", {instance = uuid}) end
if inst[1] ~= "ACTIVE" or inst[2] ~= host or (inst[4] or "") ~= expect then
    return reply({moved = true, state = inst[1], task_state = inst[4] or ""})
end
redis.call("HSET", ikey, "task_state", to, "updated_at", now)
if to == "" then redis.call("ZREM", K.host_actions(host), uuid) end
if power == "off" then
    redis.call("HSET", ikey, "power", "off")
elseif power == "on" then
    redis.call("HDEL", ikey, "power")
end
if shelved == "1" then
    redis.call("HSET", ikey, "shelved", "1", "shelved_at", now)
    redis.call("ZADD", K.host_shelved(host), now, uuid)  -- until unshelved or offloaded
elseif shelved == "0" then
    redis.call("HDEL", ikey, "shelved", "shelved_at")
    redis.call("ZREM", K.host_shelved(host), uuid)
end
if event ~= "" then
    add_event(uuid, now, event, host, inst[3], cjson.decode(detail), max_events)
end
return reply({moved = false})
