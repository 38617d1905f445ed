-- Confirm a resize or a cold migration that waits for it (VERIFY_RESIZE), in two
-- phases (docs/moves.rst):
--   ask  (the API): the move is ``confirming``; its source host destroys its copy. A
--        source whose agent is silent cannot: the source's side is held for it (its
--        agent releases it once its VM is gone) and the confirm ends at once.
--   done (the source's agent, its copy destroyed): the source's side is released; on
--        its own host the instance keeps the new flavor's amounts only.
--   take_over (a janitor: the source's agent fell silent while confirming): as
--        ``done``, the source's side held for it instead (refused if it beats again).
-- Either way the instance then holds the new flavor's quota and counts in its server
-- group on its new host only. Idempotent.
-- KEYS[1]  the migration key
-- ARGV     prefix, migration, phase (ask, done, take_over), host (done, take_over: the
--          source), now, max_events
local mig, phase, host, now, max_events = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local mkey = K.migration(mig)
local m = redis.call("HMGET", mkey, "status", "instance_uuid", "source_compute",
                     "source_node", "dest_compute", "new_allocs", "new_quota")
if not m[1] then return fail("migration_not_found", {migration = mig}) end
local uuid, source, dest = m[2], m[3], m[5]
if m[1] == "confirmed" then return reply({already = true, status = m[1]}) end
local ready = phase == "ask" and m[1] == "finished"
    or phase ~= "ask" and m[1] == "confirming" and host == source
if not ready then return fail("not_moving", {migration = mig, status = m[1], host = host}) end
if phase == "take_over" and not agent_silent(source) then
    return fail("agent_alive", {host = source})
end
local silent = phase == "take_over" or (phase == "ask" and source ~= dest and agent_silent(source))
if phase == "ask" and not silent and source ~= dest then
    redis.call("HSET", mkey, "status", "confirming", "updated_at", now)
    add_event(uuid, now, "move_confirming", source, m[4], {migration = mig}, max_events)
    return reply({status = "confirming", source_compute = source, source_node = m[4]})
end
local inst = redis.call("HMGET", K.instance(uuid), "project_id", "user_id")
if source == dest then
    replace_allocations(uuid, m[6], inst[1], inst[2])
elseif silent then
    hold_consumer(mig, uuid, source, mig)
else
    drop_allocations(mig)
end
move_quota(inst[1], uuid, m[7])
group_move_settle(uuid)
redis.call("HDEL", K.instance(uuid), "resized")
move_close(uuid, mig, "confirmed", now)
add_event(uuid, now, "move_confirmed", source, m[4],
          {migration = mig, held_for = silent and source or nil}, max_events)
return reply({status = "confirmed", source_compute = source, source_node = m[4]})
