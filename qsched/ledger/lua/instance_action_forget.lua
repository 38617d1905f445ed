-- Take an instance out of its host's actions when no action of it is under way any
-- more (ended, settled, or placed elsewhere): atomic with that check, so an action
-- started meanwhile keeps its entry.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, host, now, max_events
-- Reply    {forgotten = true|false}
local uuid, host = ARGV[2], ARGV[3]
local inst = redis.call("HMGET", K.instance(uuid), "state", "host", "task_state")
local acting = {["powering-off"] = true, ["powering-on"] = true, rebooting = true,
                reboot_started = true, rebooting_hard = true, reboot_started_hard = true,
                shelving = true, shelving_offloading = true, unshelving = true}
if inst[1] == "ACTIVE" and inst[2] == host and acting[inst[3] or ""] then
    return reply({forgotten = false})
end
redis.call("ZREM", K.host_actions(host), uuid)
return reply({forgotten = true})
