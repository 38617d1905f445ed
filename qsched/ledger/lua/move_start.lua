-- Start a move of a placed server (docs/moves.rst): check its states as Nova's API
-- does, reserve what a larger flavor adds to its quota, and write the migration record
-- waiting for a destination, as one step: two moves, or a move and an action, never
-- both go.
-- An unshelve of a server shelved and offloaded (it has no host) is a move from no
-- host: placed again through the queues as any move, with nothing held on a source.
-- KEYS[1]  the instance key
-- ARGV     prefix, instance, migration uuid, kind (resize, migration, live-migration,
--          evacuation, unshelve), the new flavor as the record keeps it ("" = its own), the new
--          scheduling class and its definition for agents ("" "" = its own), the new
--          flavor's cores and ram_mb, default instances, cores and ram_mb limits, the
--          host asked for ("" = any), "1" if the destination may be its own host,
--          request_id, user_id, project_id (of the caller), now, max_events,
--          max_attempts, deadline, block_migration ("1", "0"; "": as the driver decides)
-- Reply    {id, source_compute, source_node} once started, or {refused = "vm_state"
--          | "task_state" | "source_up" | "quota_home", state = <what refuses it>}
local uuid, mig, kind = ARGV[2], ARGV[3], ARGV[4]
local new_flavor, new_class, class_definition = ARGV[5], ARGV[6], ARGV[7]
local new_cores, new_ram = tonumber(ARGV[8]), tonumber(ARGV[9])
local defaults = {ARGV[10], ARGV[11], ARGV[12]}
local target, same_host, request_id, user_id, project_id = ARGV[13], ARGV[14], ARGV[15],
    ARGV[16], ARGV[17]
local now, max_events, max_attempts, deadline = ARGV[18], ARGV[19], ARGV[20], ARGV[21]
local block_migration = ARGV[22] or ""
local ikey = K.instance(uuid)
local inst = redis.call("HMGET", ikey, "state", "host", "node", "task_state", "power",
                        "migration", "resized", "project_id", "flavor", "class", "quota",
                        "shelved")
if not inst[1] or inst[1] == "DELETED" then
    return fail("instance_not_found", {instance = uuid})
end
local host, node, task = inst[2] or "", inst[3] or "", inst[4] or ""
local vm = ({BUILD = "building", ACTIVE = "active", ERROR = "error"})[inst[1]]
if vm == "active" and inst[7] == "1" then vm = "resized" end
if vm == "active" and inst[5] == "off" then vm = "stopped" end
if vm == "stopped" and inst[12] == "1" then vm = "shelved" end
if vm == "stopped" and inst[12] == "offloaded" then vm = "shelved_offloaded" end
-- Nova's check_instance_state for each move (nova/compute/api.py)
local allowed = {
    resize = {active = true, stopped = true},
    migration = {active = true, stopped = true},
    ["live-migration"] = {active = true},
    evacuation = {active = true, stopped = true},
    unshelve = {shelved_offloaded = true},
}
local task_states = {resize = "resize_prep", migration = "resize_prep",
                     ["live-migration"] = "migrating", evacuation = "rebuilding",
                     unshelve = "unshelving"}
if not allowed[kind] then return fail("not_waiting", {instance = uuid, state = inst[1]}) end
if (host == "") ~= (kind == "unshelve") or not allowed[kind][vm] then return reply({refused = "vm_state", state = vm}) end
if task ~= "" or inst[6] then return reply({refused = "task_state", state = task}) end
-- Nova evacuates only from a compute service that is down
if kind == "evacuation" and not agent_silent(host) then
    return reply({refused = "source_up", state = host})
end
-- a larger flavor holds its quota from now on: the larger of the two per resource,
-- until a confirm (the new flavor's) or a revert (the old one's)
local project = inst[8]
local old_quota = redis.call("HGET", K.quota_held(project), uuid) or inst[11] or ""
local new_quota = old_quota
if new_flavor ~= "" and old_quota ~= "" then
    local cores, ram = string.match(old_quota, "(%d+) (%d+)")
    cores, ram = tonumber(cores), tonumber(ram)
    -- behind the front door of several cells the deployment's quota lives in the API
    -- keyspace, which a resize does not change yet: refused rather than drifting
    if redis.call("EXISTS", K.quota_home) == 1 and (new_cores ~= cores or new_ram ~= ram) then
        return reply({refused = "quota_home", state = ""})
    end
    local want_cores, want_ram = math.max(cores, new_cores), math.max(ram, new_ram)
    local add = {0, want_cores - cores, want_ram - ram}
    if add[2] > 0 or add[3] > 0 then
        local limits = quota_limits(project, {"instances", "cores", "ram_mb"}, defaults)
        local used_key = K.quota_used(project)
        local used = redis.call("HMGET", used_key, "instances", "cores", "ram_mb")
        local names = {"instances", "cores", "ram"}
        for i = 2, 3 do
            local u = tonumber(used[i] or 0)
            if add[i] > 0 and limits[i] >= 0 and u + add[i] > limits[i] then
                return fail("quota", {resource = names[i], requested = add[i], used = u,
                                      limit = limits[i]})
            end
        end
        redis.call("HSET", used_key, "cores", tonumber(used[2] or 0) + add[2],
                   "ram_mb", tonumber(used[3] or 0) + add[3])
        new_quota = want_cores .. " " .. want_ram
        redis.call("HSET", K.quota_held(project), uuid, new_quota)
        redis.call("HSET", ikey, "quota", new_quota)
    end
    new_quota = new_cores .. " " .. new_ram  -- what a confirm leaves it holding
end
if new_class ~= "" then redis.call("HSETNX", K.classes, new_class, class_definition) end
local id = redis.call("INCR", K.migration_seq)
local status = (kind == "resize" or kind == "migration") and "pre-migrating" or "accepted"
redis.call("HSET", K.migration(mig), "id", id, "uuid", mig, "instance_uuid", uuid,
           "kind", kind, "status", status, "source_compute", host, "source_node", node,
           "dest_compute", target, "target", target, "same_host", same_host,
           "old_flavor", inst[9], "new_flavor", new_flavor ~= "" and new_flavor or inst[9],
           "old_class", inst[10] or "", "new_class", new_class ~= "" and new_class or (inst[10] or ""),
           "old_quota", old_quota, "new_quota", new_quota, "power", inst[5] or "",
           "request_id", request_id, "user_id", user_id, "project_id", project,
           "caller_project_id", project_id, "attempts", 0, "max_attempts", max_attempts,
           "tried", "[]", "deadline", deadline, "block_migration", block_migration,
           "created_at", now, "updated_at", now)
if kind ~= "unshelve" then  -- Nova lists no migration for an unshelve
    redis.call("ZADD", K.migrations, id, mig)
end
redis.call("ZADD", K.move_deadlines, deadline, mig)
redis.call("ZADD", K.instance_migrations(uuid), id, mig)
redis.call("HSET", ikey, "migration", mig, "task_state", task_states[kind], "updated_at", now)
if host ~= "" then
    redis.call("SADD", K.host_migrations(host), mig)
    redis.call("HSET", ikey, "move_from", host, "move_from_node", node)
end
add_event(uuid, now, "move_requested", host, node,
          {kind = kind, migration = mig, request_id = request_id, target = target},
          max_events)
return reply({id = id, source_compute = host, source_node = node, status = status})
