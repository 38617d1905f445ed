-- Revert a resize or a cold migration that waits for a confirm, in two phases
-- (docs/moves.rst):
--   ask  (the API): the move is ``reverting`` (task_state resize_reverting); its
--        destination destroys its copy. A destination whose agent is silent cannot:
--        its side is held for it and the revert ends at once.
--   done (the destination's agent, its copy destroyed): the destination's side is
--        released and the instance holds its source's again (on its own host, what it
--        held before), back on its source with its old flavor and quota.
--   take_over (a janitor: the destination's agent fell silent while reverting): as
--        ``done``, the destination's side held for it instead (refused if it beats
--        again).
-- Idempotent.
-- KEYS[1]  the migration key
-- ARGV     prefix, migration, phase (ask, done, take_over), host (done, take_over: the
--          destination), now, max_events
local mig, phase, host, now, max_events = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local mkey = K.migration(mig)
local m = redis.call("HMGET", mkey, "status", "instance_uuid", "source_compute",
                     "source_node", "dest_compute", "dest_node", "old_allocs", "old_quota",
                     "old_flavor", "old_class")
if not m[1] then return fail("migration_not_found", {migration = mig}) end
local uuid, source, dest = m[2], m[3], m[5]
if m[1] == "reverted" then return reply({already = true, status = m[1]}) end
local ready = phase == "ask" and m[1] == "finished"
    or phase ~= "ask" and m[1] == "reverting" and host == dest
if not ready or being_deleted(uuid) then  -- a delete under way ends the move
    return fail("not_moving", {migration = mig, status = m[1], host = host})
end
if phase == "take_over" and not agent_silent(dest) then
    return fail("agent_alive", {host = dest})
end
local ikey = K.instance(uuid)
local silent = phase == "take_over" or (phase == "ask" and agent_silent(dest))
if phase == "ask" and not silent then
    redis.call("HSET", mkey, "status", "reverting", "updated_at", now)
    redis.call("HSET", ikey, "task_state", "resize_reverting", "updated_at", now)
    add_event(uuid, now, "move_reverting", dest, m[6], {migration = mig}, max_events)
    return reply({status = "reverting", dest_compute = dest, dest_node = m[6]})
end
local inst = redis.call("HMGET", ikey, "project_id", "user_id")
if silent and source ~= dest then
    swap_consumers(uuid, mig)  -- the source's side back to the instance
    hold_consumer(mig, uuid, dest, mig)  -- the destination's, held for it
    group_count_drop(uuid, "group_move_host")
else
    move_restore(uuid, mig, source == dest, m[7], inst[1], inst[2])
end
move_quota(inst[1], uuid, m[8])
redis.call("HSET", ikey, "host", source, "node", m[4], "flavor", m[9], "task_state", "",
           "updated_at", now)
if m[10] ~= "" then redis.call("HSET", ikey, "class", m[10]) end
redis.call("HDEL", ikey, "resized")
move_close(uuid, mig, "reverted", now)
add_event(uuid, now, "move_reverted", source, m[4],
          {migration = mig, held_for = silent and dest or nil}, max_events)
return reply({status = "reverted", dest_compute = dest, dest_node = m[6]})
