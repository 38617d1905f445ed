-- A move that did not happen where it was claimed (docs/moves.rst): the destination
-- (``host``) could not spawn or receive it and cleaned up, the source of a live
-- migration could not send it (its rollback: the destination's copy is left to that
-- host's reconcile), or the API gives up on one still waiting (``host`` ""). What the destination took is given back and the
-- instance holds its source's side again. With ``retry`` and attempts left, the move
-- waits for another destination, never one that tried it; otherwise it ends (Nova's
-- ``error``, ``failed`` for a live migration or an evacuation) and the server stays
-- on its source with its old flavor and quota; an evacuation that ends so leaves the
-- server in ERROR, its source's side held for that silent host; an unshelve that ends so
-- leaves the server shelved and offloaded, as Nova's does when no host is found.
-- KEYS[1]  the migration key
-- ARGV     prefix, migration, host ("" = the API), reason, retry ("1"), now, max_events,
--          take_over ("1": a janitor's, the destination ``host`` silent: its side stays
--          held for it, as its VM may run there, refused if it beats again), the
--          consumer UUID it is held under (a take-over's: the move may go on elsewhere)
-- Reply    {retry = true, status} waiting again, or {status} ended
local mig, host, reason, retry, now, max_events = ARGV[2], ARGV[3], ARGV[4], ARGV[5] == "1",
    ARGV[6], ARGV[7]
local take_over, held_as = ARGV[8] == "1", ARGV[9] or ""
local mkey = K.migration(mig)
local m = redis.call("HMGET", mkey, "status", "instance_uuid", "kind", "source_compute",
                     "source_node", "dest_compute", "old_allocs", "old_quota", "attempts",
                     "max_attempts", "tried", "target", "asked")
if not m[1] then return fail("migration_not_found", {migration = mig}) end
local uuid, kind, source, dest = m[2], m[3], m[4], m[6] or ""
local claimed = {migrating = true, preparing = true, running = true,
                 ["post-migrating"] = true}
local waiting = MOVE_WAITING[m[1]]
local rollback = kind == "live-migration" and host == source and m[1] == "running"
if not ((host == "" and waiting) or (claimed[m[1]] and host == dest) or rollback) then
    return fail("not_moving", {migration = mig, status = m[1], host = host})
end
if take_over and not (claimed[m[1]] and host == dest and agent_silent(dest)) then
    return fail("agent_alive", {host = host})
end
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "project_id", "user_id")
if take_over and dest ~= source then
    swap_consumers(uuid, mig)  -- the source's side back to the instance
    hold_consumer(mig, uuid, dest, held_as)  -- the destination's, held for it
    group_count_drop(uuid, "group_move_host")
    redis.call("HDEL", ikey, "move_host", "move_node")
    redis.call("SREM", K.host_migrations(dest), mig)
elseif claimed[m[1]] then
    move_restore(uuid, mig, dest == source, m[7], inst[1], inst[2])
    redis.call("HDEL", ikey, "move_host", "move_node")
    redis.call("SREM", K.host_migrations(dest), mig)
end
local attempts = tonumber(m[9] or 0) + (host ~= "" and 1 or 0)
local tried = cjson.decode(m[11] or "[]")
if host ~= "" and not rollback then tried[#tried + 1] = host end
local aborted = m[13] == "abort"  -- an admin's abort: no other destination, ``cancelled``
if rollback or aborted then retry = false end
redis.call("HSET", mkey, "attempts", attempts, "tried", cjson.encode(tried), "updated_at", now)
local detail = {migration = mig, kind = kind, reason = reason, attempts = attempts}
if retry and host ~= "" and attempts < tonumber(m[10] or 1) then
    local status = (kind == "resize" or kind == "migration") and "pre-migrating" or "accepted"
    local task = ({resize = "resize_prep", migration = "resize_prep",
                   ["live-migration"] = "migrating", evacuation = "rebuilding",
                   unshelve = "unshelving"})[kind]
    redis.call("HSET", mkey, "status", status, "dest_compute", m[12] or "", "dest_node", "")
    if not being_deleted(uuid) then redis.call("HSET", ikey, "task_state", task) end
    redis.call("HSET", ikey, "updated_at", now)
    add_event(uuid, now, "move_retried", host, nil, detail, max_events)
    return reply({retry = true, status = status})
end
local status = (kind == "resize" or kind == "migration") and "error" or "failed"
if aborted then status = "cancelled" end
move_quota(inst[1], uuid, m[8])
move_close(uuid, mig, status, now)
redis.call("HSET", mkey, "fault", reason)
if not being_deleted(uuid) then redis.call("HSET", ikey, "task_state", "") end
redis.call("HSET", ikey, "updated_at", now)
add_event(uuid, now, aborted and "move_cancelled" or "move_failed", host ~= "" and host or nil,
          nil, detail, max_events)
if kind == "evacuation" then
    local held = hold_claim(uuid, source, mig)
    local fault = cjson.encode({code = 500, message = "No valid host was found. " .. reason,
                                created = tonumber(now)})
    end_instance(uuid, {project = inst[1], host = source, node = m[5]}, "ERROR", fault, now,
                 max_events, {reason = "evacuation failed", held_for = held and source or nil})
end
return reply({status = status})
