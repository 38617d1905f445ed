-- Drop the claim of an instance still in BUILD, so it can be placed again.
-- KEYS[1]  the instance key
-- ARGV     prefix, instance, host ("" = whichever), now, max_events, reason
local uuid, host, now, max_events, reason = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "state", "host", "node")
local claimed_by = inst[2] or ""
-- An ACTIVE instance keeps its resources: only ending it (ERROR, DELETED) frees them.
if inst[1] ~= "BUILD" or (host ~= "" and claimed_by ~= host) then
    return reply({released = false})
end
local released = drop_allocations(uuid)
unbuild(uuid, claimed_by)
group_unclaim(uuid)
batch_unclaim(uuid)
if claimed_by ~= "" then
    redis.call("HSET", ikey, "host", "", "node", "", "task_state", "scheduling",
               "updated_at", now)
    outbox_add(uuid)
    if reason ~= "" then
        add_event(uuid, now, "released", claimed_by, inst[3], {reason = reason}, max_events)
    end
    released = true
end
return reply({released = released})
