-- A move's host says its part is done (docs/moves.rst). Idempotent: a host that says
-- it again of a move already past this step gets ``already``.
--   resize, migration: the destination runs the server; it is there now, with its new
--       flavor, and waits for a confirm or a revert (VERIFY_RESIZE): both sides held.
--   live-migration: the destination says it is ready to receive the server (``running``:
--       the source may send it); then the source says its VM left for the destination:
--       the source's side is released, the move completed.
--   evacuation: the destination rebuilt the server; the source's side stays held for
--       the source host (its VM may run there still) until its agent says it is gone.
--   unshelve: the destination spawned the offloaded server: it runs there, unshelved.
-- KEYS[1]  the migration key
-- ARGV     prefix, migration, host, now, max_events
local mig, host, now, max_events = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local mkey = K.migration(mig)
local m = redis.call("HMGET", mkey, "status", "instance_uuid", "kind", "source_compute",
                     "dest_compute", "dest_node", "new_flavor", "new_class", "asked")
if not m[1] then return fail("migration_not_found", {migration = mig}) end
local uuid, kind, source, dest, dest_node = m[2], m[3], m[4], m[5], m[6]
if being_deleted(uuid) then  -- the delete ends the move where the record has the server
    return fail("not_moving", {migration = mig, status = m[1], host = host})
end
if kind == "live-migration" and host == dest and m[1] == "preparing" then
    -- an abort asked while the destination prepared: it gives its claim back (move_fail)
    if m[9] == "abort" then return fail("move_aborted", {migration = mig}) end
    redis.call("HSET", mkey, "status", "running", "updated_at", now)
    add_event(uuid, now, "move_running", dest, dest_node, {migration = mig}, max_events)
    return reply({status = "running", source_compute = source})
end
local by = kind == "live-migration" and source or dest
local ending = {migrating = true, running = true, ["post-migrating"] = true}
if host ~= by or not ending[m[1]] then
    local done = {finished = true, confirming = true, confirmed = true, completed = true,
                  done = true}
    if host == by and done[m[1]] then return reply({already = true, status = m[1]}) end
    if kind == "live-migration" and host == dest and m[1] == "running" then
        return reply({already = true, status = m[1], source_compute = source})
    end
    return fail("not_moving", {migration = mig, status = m[1], host = host})
end
local ikey = K.instance(uuid)
redis.call("HSET", ikey, "host", dest, "node", dest_node, "task_state", "", "updated_at", now)
local status
if kind == "resize" or kind == "migration" then
    status = "finished"
    redis.call("HSET", ikey, "flavor", m[7], "resized", "1")
    if m[8] ~= "" then redis.call("HSET", ikey, "class", m[8]) end
    redis.call("HSET", mkey, "status", status, "updated_at", now)
    redis.call("ZADD", K.moves_finished, now, mig)  -- until confirmed or reverted
else
    status = kind == "evacuation" and "done" or "completed"
    if kind == "unshelve" then
        redis.call("HDEL", ikey, "shelved", "shelved_at", "power")
        if m[8] ~= "" then redis.call("HSET", ikey, "class", m[8]) end
    end
    if kind == "evacuation" then
        hold_consumer(mig, uuid, source, mig)
    else
        drop_allocations(mig)
    end
    group_move_settle(uuid)
    move_close(uuid, mig, status, now)
end
add_event(uuid, now, "move_finished", dest, dest_node,
          {migration = mig, kind = kind, status = status}, max_events)
return reply({status = status})
