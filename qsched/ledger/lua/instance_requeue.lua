-- Count an attempt and put a BUILD instance back to waiting, releasing any claim.
-- An instance marked deleting meanwhile ends DELETED instead (quota returned), so
-- a delete that raced with a failed spawn is never lost.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, host ("" = any), reason, claimed only ("1": the instance
--          must be claimed by host, so an orphan taken back twice is requeued once),
--          held (a take-over, the janitor's: "" = none; else host's agent is silent
--          and the claim is taken from it, held for it under this consumer UUID, and
--          refused if that agent beats again), now, max_events
local uuid, host, reason = ARGV[2], ARGV[3], ARGV[4]
local claimed_only, held, now, max_events = ARGV[5] == "1", ARGV[6], ARGV[7], ARGV[8]
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "state", "host", "task_state", "project_id")
if not inst[1] then return fail("instance_not_found", {instance = uuid}) end
local claimed_by = inst[2] or ""
local others = host ~= "" and claimed_by ~= host and (claimed_only or claimed_by ~= "")
if inst[1] ~= "BUILD" or others then
    return fail("not_waiting", {instance = uuid, state = inst[1], host = claimed_by})
end
local detail = {reason = reason}
if held ~= "" then
    if not agent_silent(claimed_by) then return fail("agent_alive", {host = claimed_by}) end
    if hold_claim(uuid, claimed_by, held) then detail.held_for = claimed_by end
end
if inst[3] == "deleting" then
    end_instance(uuid, {project = inst[4], host = claimed_by}, "DELETED", "", now, max_events,
                 detail)
    return reply({attempts = -1})
end
drop_allocations(uuid)
unbuild(uuid, claimed_by)
group_unclaim(uuid)
batch_unclaim(uuid)
-- the host that held it is tried: a request rebuilt from this record says so
if claimed_by ~= "" then add_tried_host(ikey, claimed_by) end
local attempts = redis.call("HINCRBY", ikey, "attempts", 1)
redis.call("HSET", ikey, "host", "", "node", "", "task_state", "scheduling",
           "updated_at", now)
-- whoever requeued it publishes it; if that is lost, the janitor does
local outbox = outbox_add(uuid)
detail.attempts = attempts
add_event(uuid, now, "requeued", host, nil, detail, max_events)
return reply({attempts = attempts, outbox = outbox})
