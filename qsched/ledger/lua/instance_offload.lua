-- Offload a server shelved on its host (docs/moves.rst, "Shelve"): its host's agent
-- destroyed its VM there, so its allocations go, it no longer counts for its server
-- group on that host, and it keeps no host: SHELVED_OFFLOADED, its quota still held
-- (as Nova counts a shelved server's). Only while the record is shelved on that host
-- with the offload under way, so a delete or an unshelve that took over is never
-- undone. The event is the step's (as instance_action_step.lua writes it).
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, host, event, event detail (JSON), now, max_events
-- Reply    {moved = false} when offloaded, {moved = true, state, task_state} when not
local uuid, host, event, detail, now, max_events =
    ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "state", "host", "node", "task_state", "shelved")
if not inst[1] then return fail("instance_not_found", {instance = uuid}) end
if inst[1] ~= "ACTIVE" or inst[2] ~= host or inst[4] ~= "shelving_offloading"
        or inst[5] ~= "1" then
    return reply({moved = true, state = inst[1], task_state = inst[4] or ""})
end
drop_allocations(uuid)
group_unclaim(uuid)
redis.call("ZREM", K.host_shelved(host), uuid)
redis.call("ZREM", K.host_actions(host), uuid)
redis.call("HSET", ikey, "shelved", "offloaded", "power", "off", "task_state", "",
           "updated_at", now)
redis.call("HDEL", ikey, "host", "node")
add_event(uuid, now, event, host, inst[3], cjson.decode(detail), max_events)
return reply({moved = false})
