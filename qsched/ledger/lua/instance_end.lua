-- End an instance: ERROR (only from BUILD) or DELETED (from anything), releasing
-- its allocations and its quota.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, "ERROR" or "DELETED", fault JSON ("" = none), the condition
--          ("" = none; "due": ERROR only once the record's own deadline has passed,
--          else the reply not_due; JSON {host, node}: ERROR from ACTIVE on that host and
--          node with no task under way, for a VM its driver no longer runs), destroyed
--          on (the host whose agent destroyed its VM: its claim held for that host, if
--          any, goes too; "" = none), held (a take-over: "" = none; else the host of
--          the instance is silent and its claim is held for it under this consumer
--          UUID, refused if its agent beats again), now, max_events
local uuid, state, fault, condition = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local destroyed_on, held, now, max_events = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local inst = redis.call("HMGET", K.instance(uuid), "state", "project_id", "host", "node",
                        "deadline", "task_state")
if not inst[1] then return fail("instance_not_found", {instance = uuid}) end
if destroyed_on ~= "" then drop_held(destroyed_on, uuid) end
if inst[1] == "DELETED" then return reply({changed = false}) end
local lost = string.sub(condition, 1, 1) == "{" and cjson.decode(condition) or nil
if lost then
    if inst[1] ~= "ACTIVE" or inst[3] ~= lost.host or inst[4] ~= lost.node
            or (inst[6] or "") ~= "" then
        return reply({changed = false})
    end
elseif state == "ERROR" and inst[1] ~= "BUILD" then
    return reply({changed = false})
end
if condition == "due" and tonumber(inst[5] or 0) > tonumber(now) then
    return fail("not_due", {instance = uuid, deadline = inst[5]})
end
local detail = {}
local take_over = held ~= "" and inst[3] and inst[3] ~= ""
if take_over and not agent_silent(inst[3]) then return fail("agent_alive", {host = inst[3]}) end
move_end(uuid, inst[3] or "", now)  -- first: its own consumer then holds its host's side
if take_over then
    if hold_claim(uuid, inst[3], held) then detail.held_for = inst[3] end
end
end_instance(uuid, {project = inst[2], host = inst[3], node = inst[4]}, state, fault, now,
             max_events, detail)
return reply({changed = true})
