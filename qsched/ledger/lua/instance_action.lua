-- Start a server action (stop, start, reboot, shelve, shelve_offload, and unshelve of a
-- server shelved on its host) on a placed instance: check its
-- vm_state and task_state and set the action's task_state in one step, so two
-- actions (or an action and a delete) never both go. Nova's rules:
-- nova/compute/api.py check_instance_host, then check_instance_state.
-- A rebuild changes the record in the same step: items of its extra (the image, its
-- traits, the server's fields), its name, and its scheduling class when the image's
-- traits make another.
-- KEYS[1]  the instance key
-- ARGV     prefix, uuid, action, request_id, user_id, project_id, the items of extra to
--          set (a JSON list of key, value, ... each JSON text), the new name ("" = kept),
--          the new scheduling class and its definition ("" "" = kept), now, max_events
-- Reply    {host, node} once started, or {refused = "not_ready" | "vm_state" |
--          "task_state", state = <the state that refuses it>}
local uuid, action, request_id, user_id, project_id = ARGV[2], ARGV[3], ARGV[4], ARGV[5],
    ARGV[6]
local items, name, class, definition, now, max_events = ARGV[7], ARGV[8], ARGV[9], ARGV[10],
    ARGV[11], ARGV[12]
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "state", "host", "node", "task_state", "power",
                        "resized", "shelved", "extra")
if not inst[1] or inst[1] == "DELETED" then
    return fail("instance_not_found", {instance = uuid})
end
local host, node, task = inst[2] or "", inst[3] or "", inst[4] or ""
if inst[7] == "offloaded" then  -- no host: only an unshelve places it again (move_start.lua)
    return reply({refused = "vm_state", state = "shelved_offloaded"})
end
if host == "" then return reply({refused = "not_ready"}) end
local vm = ({BUILD = "building", ACTIVE = "active", ERROR = "error"})[inst[1]]
if vm == "active" and inst[6] == "1" then vm = "resized" end  -- a move waits for a confirm
if vm == "active" and inst[5] == "off" then vm = "stopped" end
if vm == "stopped" and inst[7] == "1" then vm = "shelved" end
local reboot_states = {[""] = true, rebooting = true, reboot_started = true,
                       rebooting_hard = true, reboot_started_hard = true}
local rules = {
    stop = {vm = {active = true}, task = {[""] = true}, to = "powering-off", name = "stop"},
    start = {vm = {stopped = true}, task = {[""] = true}, to = "powering-on", name = "start"},
    reboot_soft = {vm = {active = true}, task = {[""] = true}, to = "rebooting",
                   name = "reboot"},
    reboot_hard = {vm = {active = true, stopped = true}, task = reboot_states,
                   to = "rebooting_hard", name = "reboot"},
    shelve = {vm = {active = true, stopped = true}, task = {[""] = true}, to = "shelving",
              name = "shelve"},
    shelve_offload = {vm = {shelved = true}, task = {[""] = true},
                      to = "shelving_offloading", name = "shelveOffload"},
    unshelve = {vm = {shelved = true}, task = {[""] = true}, to = "unshelving",
                name = "unshelve"},
    rebuild = {vm = {active = true, stopped = true}, task = {[""] = true}, to = "rebuilding",
               name = "rebuild"},
}
local rule = rules[action]
if not rule then return fail("not_waiting", {instance = uuid, state = inst[1], host = host}) end
if not rule.vm[vm] then return reply({refused = "vm_state", state = vm}) end
if not rule.task[task] then return reply({refused = "task_state", state = task}) end
redis.call("HSET", ikey, "task_state", rule.to, "updated_at", now)
local set = cjson.decode(items)
if #set > 0 then
    local extra = json_members(inst[8] or "{}") or {}
    for i = 1, #set, 2 do extra[set[i]] = set[i + 1] end
    redis.call("HSET", ikey, "extra", (json_object(extra)))
end
if name ~= "" then redis.call("HSET", ikey, "name", name) end
if class ~= "" then
    redis.call("HSET", ikey, "class", class)
    redis.call("HSETNX", K.classes, class, definition)
end
redis.call("ZADD", K.host_actions(host), now, uuid)  -- until its agent settles it
add_event(uuid, now, "action", host, node,
          {action = rule.name, request_id = request_id, user_id = user_id,
           project_id = project_id}, max_events)
return reply({host = host, node = node, task_state = rule.to})
