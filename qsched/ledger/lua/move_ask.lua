-- Ask a live migration under way to complete now (``force_complete``: its source pauses
-- the server so that the copy converges) or to stop (``abort``: it rolls back, the
-- server stays on its source, the migration ends ``cancelled``): checked as Nova's API
-- checks it and recorded on the migration, with the instance action, in one step. The
-- hosts read what was asked where they act (docs/moves.rst, "Live migration"). An
-- abort is never taken back by a later force_complete.
-- KEYS[1]  the migration key
-- ARGV     prefix, migration, instance, what is asked ("force_complete", "abort"), the
--          statuses it may be asked in (JSON list), Nova's instance action, request_id,
--          user_id, project_id (of the caller), now, max_events
-- Reply    {status} when asked, or {refused = "migration" (not this server's live
--          migration) | "instance" (the server is not live-migrating) | "status",
--          state = <what refuses it>}
local mig, uuid, ask, allowed, action = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local request_id, user_id, project_id, now, max_events = ARGV[7], ARGV[8], ARGV[9], ARGV[10],
    ARGV[11]
local mkey = K.migration(mig)
local m = redis.call("HMGET", mkey, "status", "instance_uuid", "kind", "asked")
if not m[1] or m[2] ~= uuid or m[3] ~= "live-migration" then
    return reply({refused = "migration", state = m[3] or ""})
end
local inst = redis.call("HMGET", K.instance(uuid), "state", "task_state", "power")
if inst[1] ~= "ACTIVE" or inst[2] ~= "migrating" or inst[3] == "off" then
    return reply({refused = "instance", state = inst[2] or ""})
end
local ok = false
for _, status in ipairs(cjson.decode(allowed)) do ok = ok or status == m[1] end
if not ok then return reply({refused = "status", state = m[1]}) end
if m[4] ~= "abort" then redis.call("HSET", mkey, "asked", ask, "updated_at", now) end
add_event(uuid, now, "action", nil, nil,
          {action = action, migration = mig, request_id = request_id, user_id = user_id,
           project_id = project_id}, max_events)
return reply({status = m[1]})
