-- Shared helpers, prepended to every qsched script when it is loaded.
--
-- Keys: no script spells a key name. The loader puts before this file a prelude
-- generated from the Python Keyspace (qsched/ledger/keys.py): P, the cell's
-- prefix "qsched:{cell}:" (ARGV[1] of every script), and K, one builder per key:
-- K.instance(uuid), K.provider_consumers(rp), K.quota_held(project), ... for a
-- key with a variable part, K.outbox, K.deadlines, K.flavors, ... for a key of
-- the whole cell. Every key starts with P, so a cell stays in one cluster slot.
-- What each key holds and who writes it: the keyspace table in docs/ledger.rst.
-- tests/ledger/test_keyspace.py fails on a key fragment spelled in any .lua file.

local function reply(t)
    return cjson.encode(t)
end

local function fail(code, t)
    t = t or {}
    t.error = code
    return cjson.encode(t)
end

-- "total reserved min_unit max_unit step_size ratio" -> table
local function parse_inventory(s)
    if not s then return nil end
    local f = {}
    for w in string.gmatch(s, "%S+") do f[#f + 1] = tonumber(w) end
    return {total = f[1], reserved = f[2], min_unit = f[3], max_unit = f[4],
            step_size = f[5], ratio = f[6]}
end

local function capacity(inv)
    return math.floor((inv.total - inv.reserved) * inv.ratio)
end

local function add_event(uuid, now, event, host, node, detail, max_events)
    local key = K.instance_events(uuid)
    local entry = {t = tonumber(now), event = event, detail = detail}
    if host and host ~= "" then entry.host = host end
    if node and node ~= "" then entry.node = node end
    local n = redis.call("RPUSH", key, cjson.encode(entry))
    local keep = tonumber(max_events)
    if n > keep then
        redis.call("LTRIM", key, n - keep, -1)
        redis.call("HINCRBY", K.instance(uuid), "events_trimmed", n - keep)
    end
end

-- The server's clock in seconds: the outbox ages by it, whatever the callers' clocks
-- (a create that waited in a stalled server's buffers is as young as when it ran).
local function server_now()
    local t = redis.call("TIME")
    return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- An instance now waits for its boot request to be published (created, requeued).
-- Returns its score as a string (JSON numbers would round it): the publisher clears
-- the entry with it once the broker confirmed.
local function outbox_add(uuid)
    local score = string.format("%.6f", server_now())
    redis.call("ZADD", K.outbox, score, uuid)
    return score
end

-- Its request was published, claimed, or it ended: true if it was still waiting.
local function outbox_drop(uuid)
    return redis.call("ZREM", K.outbox, uuid) == 1
end

-- Forget that a host is building an instance (claimed, not ACTIVE yet).
local function unbuild(uuid, host)
    if host and host ~= "" then
        redis.call("SREM", K.host_building(host), uuid)
    end
end

-- Forget that a host still has to delete an instance.
local function undelete(uuid, host)
    if host and host ~= "" then
        redis.call("ZREM", K.host_deleting(host), uuid)
    end
end

-- Remove every allocation of a consumer: usages, project usages, provider
-- consumer sets, one generation bump per provider. Returns true if it held any.
local function drop_allocations(consumer)
    local ckey = K.consumer(consumer)
    local raw = redis.call("HGET", ckey, "allocs")
    if not raw then return false end
    local project = redis.call("HGET", ckey, "project")
    local allocs = cjson.decode(raw)
    for rp, amounts in pairs(allocs) do
        local rkey = K.provider(rp)
        for rc, n in pairs(amounts) do
            redis.call("HINCRBY", rkey, "u:" .. rc, -n)
            redis.call("HINCRBY", K.project_usage(project), rc, -n)
        end
        redis.call("SREM", K.provider_consumers(rp), consumer)
        redis.call("HINCRBY", rkey, "generation", 1)
    end
    redis.call("DEL", ckey)
    return true
end

-- Hold the allocations of consumer ``from`` for a host where instance ``uuid`` may
-- still run, under the consumer that host already holds for it or else ``held``:
-- only that host's agent releases a held claim, once its driver does not run the
-- instance (release_held.lua). ``from`` may be ``held`` itself (a move's consumer
-- held where it is). Returns true if ``from`` held anything.
local function hold_consumer(from, uuid, host, held)
    local ckey = K.consumer(from)
    local cur = redis.call("HMGET", ckey, "allocs", "project", "user")
    if not cur[1] then return false end
    local hkey = K.host_held(host)
    held = redis.call("HGET", hkey, uuid) or held
    local hold = K.consumer(held)
    local allocs = {}
    local before = held ~= from and redis.call("HGET", hold, "allocs")
    if before then allocs = cjson.decode(before) end
    for rp, amounts in pairs(cjson.decode(cur[1])) do
        allocs[rp] = allocs[rp] or {}
        for rc, n in pairs(amounts) do allocs[rp][rc] = (allocs[rp][rc] or 0) + n end
        redis.call("SREM", K.provider_consumers(rp), from)
        redis.call("SADD", K.provider_consumers(rp), held)
    end
    if held ~= from then redis.call("DEL", ckey) end
    redis.call("HSET", hold, "allocs", cjson.encode(allocs), "project", cur[2], "user", cur[3],
               "held_for", host, "instance", uuid)
    redis.call("HINCRBY", hold, "generation", 1)
    redis.call("HSET", hkey, uuid, held)
    return true
end

-- Take the claim of an instance from a host whose agent did not give it up (silent past
-- its heartbeat, its service forced down): its VM may still run there, so its
-- allocations stay on the same providers, held for that host under the consumer
-- ``held`` (a new UUID from the caller), and the instance's own consumer is free to claim
-- elsewhere. A claim taken from the same host twice is held as one. Returns true if
-- the instance held anything.
local function hold_claim(uuid, host, held)
    return hold_consumer(uuid, uuid, host, held)
end

-- Release the claim held for a host of an instance (hold_claim), if any: its agent
-- says the instance no longer runs there. Returns true if one was held.
local function drop_held(host, uuid)
    local held = redis.call("HGET", K.host_held(host), uuid)
    if not held then return false end
    drop_allocations(held)
    redis.call("HDEL", K.host_held(host), uuid)
    return true
end

-- Whether a host's agent is silent: its heartbeat expired, or an operator forced its
-- service down (Nova's "down"). Only then may others take its claims.
local function agent_silent(host)
    return redis.call("EXISTS", K.agent(host)) == 0
        or redis.call("HGET", K.service(host), "forced_down") == "1"
end

-- A project's limits on names: its own (os-quota-sets), else the default quota class's
-- (os-quota-class-sets), else the configured defaults (as script arguments).
local function quota_limits(project, names, defaults)
    local own = redis.call("HMGET", K.quota_limits(project), unpack(names))
    local complete = true
    for i = 1, #names do complete = complete and own[i] ~= false end
    -- the default class is read only for the limits the project has not set
    local class = complete and {} or redis.call("HMGET", K.quota_class_default, unpack(names))
    local limits = {}
    for i = 1, #names do limits[i] = tonumber(own[i] or class[i] or defaults[i]) end
    return limits
end

local function quota_limit(project, name, default)
    return quota_limits(project, {name}, {default})[1]
end

-- How many servers a group of project may hold: ``default`` as is when ``final`` is "1"
-- (the front door of several cells gives the deployment's limit, read in the API
-- keyspace), else the project's override, the default class's, or ``default``.
local function group_member_limit(project, default, final)
    if final == "1" then return tonumber(default) end
    return quota_limit(project, "server_group_members", default)
end

-- Return what a holder reserved against its project's quota.
local function release_quota(project, holder)
    local held_key = K.quota_held(project)
    local held = redis.call("HGET", held_key, holder)
    if not held then return false end
    local cores, ram = string.match(held, "(%d+) (%d+)")
    local used = K.quota_used(project)
    local u = redis.call("HMGET", used, "instances", "cores", "ram_mb")
    -- one write for the three counters (a script runs alone: nothing changes them between)
    redis.call("HSET", used, "instances", tonumber(u[1] or 0) - 1,
               "cores", tonumber(u[2] or 0) - tonumber(cores),
               "ram_mb", tonumber(u[3] or 0) - tonumber(ram))
    redis.call("HDEL", held_key, holder)
    if redis.call("EXISTS", K.quota_home) == 1 then
        -- the API keyspace holds this cell's quota too: its mover releases it there
        redis.call("ZADD", K.quota_ends, server_now(), cjson.encode({project, holder}))
    end
    return true
end

-- Reserve one instance with cores and ram for holder; limits are -1 for none.
-- Returns nil on success or the failure reply.
local function reserve_quota(project, holder, cores, ram, defaults)
    local held_key = K.quota_held(project)
    if redis.call("HEXISTS", held_key, holder) == 1 then return nil end
    local limits = quota_limits(project, {"instances", "cores", "ram_mb"}, defaults)
    local used_key = K.quota_used(project)
    local used = redis.call("HMGET", used_key, "instances", "cores", "ram_mb")
    local names = {"instances", "cores", "ram"}
    local want = {1, cores, ram}
    for i = 1, 3 do
        local limit = limits[i]
        local u = tonumber(used[i] or 0)
        if limit >= 0 and u + want[i] > limit then
            return fail("quota", {resource = names[i], requested = want[i], used = u,
                                  limit = limit})
        end
    end
    redis.call("HSET", used_key, "instances", tonumber(used[1] or 0) + 1,
               "cores", tonumber(used[2] or 0) + cores, "ram_mb", tonumber(used[3] or 0) + ram)
    redis.call("HSET", held_key, holder, cores .. " " .. ram)
    return nil
end

-- Server groups (docs/server-groups.rst). A member counts in its group's hosts hash on
-- the host of its claim, from the claim until the claim is dropped (released, requeued,
-- ended); its record's group_host field says where it counts, so that dropping it twice
-- changes nothing. Every step reads a constant number of keys, whatever the cloud's size.

-- How many times a claim passes a member of a soft-policy group on to another host
-- (docs/server-groups.rst); then any host that fits takes it.
local GROUP_SOFT_TRIES = 5

-- The host holding most members of a group (ties: the first name), or nil; the
-- group's member limit bounds the HGETALL.
local function group_busiest(hosts)
    local best, most = nil, 0
    local flat = redis.call("HGETALL", hosts)
    for i = 1, #flat, 2 do
        local n = tonumber(flat[i + 1])
        if n > most or (n == most and best and flat[i] < best) then best, most = flat[i], n end
    end
    return best
end

-- A hard refusal, counted on the member's record (the agent parks it every so many).
local function group_refused(ikey, why)
    why.refusals = redis.call("HINCRBY", ikey, "group_refusals", 1)
    return fail("group_policy", why)
end

-- The failure reply of a claim of uuid on host that would break the policy of its
-- group, or nil. Hard policies always refuse; a soft one refuses (marked soft) while
-- the member has passes left, counted on its record. A deleted group keeps no rule.
local function group_refusal(uuid, host)
    local ikey = K.instance(uuid)
    local f = redis.call("HMGET", ikey, "group", "soft_passes")
    local group = f[1]
    if not group or group == "" then return nil end
    local g = redis.call("HMGET", K.group(group), "policy", "max_server_per_host")
    local policy, hosts = g[1], K.group_hosts(group)
    local why = {instance = uuid, group = group, policy = policy, host = host}
    if policy == "anti-affinity" then
        why.max_server_per_host = tonumber(g[2]) or 1
        why.members = tonumber(redis.call("HGET", hosts, host) or 0)
        if why.members >= why.max_server_per_host then return group_refused(ikey, why) end
    elseif policy == "affinity" and redis.call("HEXISTS", hosts, host) == 0 then
        -- the policy keeps an affinity group on one host: HKEYS reads one field at most
        why.holder = redis.call("HKEYS", hosts)[1]
        if why.holder then return group_refused(ikey, why) end
    elseif policy and tonumber(f[2] or 0) < GROUP_SOFT_TRIES then
        why.members = tonumber(redis.call("HGET", hosts, host) or 0)
        local elsewhere = policy == "soft-anti-affinity" and why.members > 0
        if policy == "soft-affinity" and why.members == 0 then
            why.holder = group_busiest(hosts)
            elsewhere = why.holder ~= nil
        end
        if elsewhere then
            why.soft, why.passes = true, redis.call("HINCRBY", ikey, "soft_passes", 1)
            return fail("group_policy", why)
        end
    end
    return nil
end

-- Count a claimed member of a group on its host; ``field`` (default group_host) names
-- the record's field that says where (group_move_host: the destination of its move).
local function group_claim(uuid, host, field)
    local ikey = K.instance(uuid)
    local group = redis.call("HGET", ikey, "group")
    if not group or group == "" or redis.call("EXISTS", K.group(group)) == 0 then return end
    redis.call("HINCRBY", K.group_hosts(group), host, 1)
    redis.call("HSET", ikey, field or "group_host", host)
end

-- One count of a member on a host dropped: ``field`` names the record's field that
-- says where (group_host, or group_move_host: the destination of its move).
local function group_count_drop(uuid, field)
    local ikey = K.instance(uuid)
    local f = redis.call("HMGET", ikey, "group", field)
    if not f[1] or not f[2] or f[2] == "" then return end
    local hosts = K.group_hosts(f[1])
    if redis.call("HINCRBY", hosts, f[2], -1) <= 0 then redis.call("HDEL", hosts, f[2]) end
    redis.call("HDEL", ikey, field)
end

-- A member's claim was dropped: it no longer counts on its host (nor on the
-- destination of a move it was making).
local function group_unclaim(uuid)
    group_count_drop(uuid, "group_host")
    group_count_drop(uuid, "group_move_host")
end

-- A move confirmed: the member counts on its destination only.
local function group_move_settle(uuid)
    local ikey = K.instance(uuid)
    local dest = redis.call("HGET", ikey, "group_move_host")
    if not dest then return end
    group_count_drop(uuid, "group_host")
    redis.call("HSET", ikey, "group_host", dest)
    redis.call("HDEL", ikey, "group_move_host")
end

-- Batches: the members of one multi-create, placed all or none (docs/server-groups.rst).
-- A member counts in its batch's claimed from its claim until the claim is dropped; the
-- batch is permitted (its spawns may start) once every member holds a claim, failed
-- (every member ends in ERROR) when one ends in ERROR before that. Its record's
-- batch_claimed field makes counting twice impossible. Costs are O(1) per claim; only
-- failing a batch reads its members (at most its max_count).

-- After a claim of uuid: count it, and tell into.batch and into.permitted.
local function batch_claim(uuid, into)
    local ikey = K.instance(uuid)
    local f = redis.call("HMGET", ikey, "batch", "batch_claimed")
    if not f[1] or f[1] == "" then return end
    local bkey = K.batch(f[1])
    local b = redis.call("HMGET", bkey, "state", "size", "claimed")
    into.batch = f[1]
    if b[1] ~= "waiting" then  -- permitted, or expired: the member is on its own now
        into.permitted = b[1] ~= "failed"
        return
    end
    local claimed = tonumber(b[3])
    if f[2] ~= "1" then
        redis.call("HSET", ikey, "batch_claimed", "1")
        claimed = redis.call("HINCRBY", bkey, "claimed", 1)
    end
    into.permitted = claimed >= tonumber(b[2])
    if into.permitted then redis.call("HSET", bkey, "state", "permitted") end
end

-- A member's claim was dropped before its batch was permitted: it counts no more.
local function batch_unclaim(uuid)
    local ikey = K.instance(uuid)
    local f = redis.call("HMGET", ikey, "batch", "batch_claimed")
    if f[2] ~= "1" then return end
    redis.call("HDEL", ikey, "batch_claimed")
    local bkey = K.batch(f[1])
    if redis.call("HGET", bkey, "state") == "waiting" then
        redis.call("HINCRBY", bkey, "claimed", -1)
    end
end

-- A member ends: DELETED takes it out of a waiting batch (which may be complete then);
-- ERROR fails the batch. Returns the other members to end in ERROR with it.
local function batch_end(uuid, state)
    local batch = redis.call("HGET", K.instance(uuid), "batch")
    if not batch or batch == "" then return {} end
    local bkey, members = K.batch(batch), K.batch_members(batch)
    if redis.call("HGET", bkey, "state") ~= "waiting" then return {} end
    if state == "DELETED" then
        redis.call("SREM", members, uuid)
        local size = redis.call("HINCRBY", bkey, "size", -1)
        if size > 0 and tonumber(redis.call("HGET", bkey, "claimed")) >= size then
            redis.call("HSET", bkey, "state", "permitted")
        end
        return {}
    end
    redis.call("HSET", bkey, "state", "failed")
    local others = {}
    for _, other in ipairs(redis.call("SMEMBERS", members)) do
        if other ~= uuid then others[#others + 1] = other end
    end
    return others
end

-- The fault of a member ended because another member of its batch could not be placed.
local function batch_fault(fault, now, batch, member)
    local t = fault ~= "" and cjson.decode(fault) or {code = 500, message = "No valid host"}
    t.details = {reason = "batch", batch = batch, member = member}
    t.created = tonumber(now)
    return cjson.encode(t)
end

-- How many DELETED instances a project's index of recent deletions keeps (its
-- changes-since list); the oldest leave first. The cell's index keeps every DELETED
-- instance until archive-deleted takes it out (instance_archive.lua): it is what the
-- archive reads, oldest first; a changes-since list reads its newest only.
local DELETED_KEPT_PROJECT = 1000

-- Add a DELETED instance to an index of deletions by time, keeping the newest ``keep``
-- (nil: all).
local function deleted_index(key, uuid, now, keep)
    redis.call("ZADD", key, now, uuid)
    if keep then redis.call("ZREMRANGEBYRANK", key, 0, -(keep + 1)) end
end

-- Moves (docs/moves.rst) -----------------------------------------------------------
-- A move (resize, cold or live migration, evacuation) is a migration record,
-- migration:<uuid>, with Nova's statuses. From the destination's claim on, the
-- instance's consumer holds the destination's resources and the migration's consumer
-- (the migration's uuid) the source's, Nova's migration-based allocations; a resize
-- on its own host holds the larger of the two flavors per class in the instance's
-- consumer alone. Every step is one script, O(1) in the size of the cloud.

-- The statuses a move waits in for a destination, and the final ones.
local MOVE_WAITING = {["pre-migrating"] = true, accepted = true}
local MOVE_FINAL = {confirmed = true, reverted = true, error = true, failed = true,
                    completed = true, done = true, cancelled = true}

-- Replace a consumer's allocations with ``raw`` (JSON {rp: {rc: n}}; "" or "{}": none)
-- for project and user: usages and provider sets follow, its generation goes up.
local function replace_allocations(consumer, raw, project, user)
    local ckey = K.consumer(consumer)
    local gen = tonumber(redis.call("HGET", ckey, "generation") or 0)
    drop_allocations(consumer)
    local allocs = (raw ~= "" and cjson.decode(raw)) or {}
    local any = false
    for rp, amounts in pairs(allocs) do
        local rkey = K.provider(rp)
        for rc, n in pairs(amounts) do
            redis.call("HINCRBY", rkey, "u:" .. rc, n)
            redis.call("HINCRBY", K.project_usage(project), rc, n)
        end
        redis.call("SADD", K.provider_consumers(rp), consumer)
        redis.call("HINCRBY", rkey, "generation", 1)
        any = true
    end
    if any then
        redis.call("HSET", ckey, "generation", gen + 1, "allocs", raw, "project", project,
                   "user", user)
    end
    return any
end

-- Exchange what two consumers hold (usages do not change: one project owns both).
local function swap_consumers(a, b)
    local ka, kb = K.consumer(a), K.consumer(b)
    local fa, fb = redis.call("HGETALL", ka), redis.call("HGETALL", kb)
    local function rps(flat)
        for i = 1, #flat, 2 do
            if flat[i] == "allocs" then return cjson.decode(flat[i + 1]) end
        end
        return {}
    end
    local ra, rb = rps(fa), rps(fb)
    for rp in pairs(ra) do redis.call("SREM", K.provider_consumers(rp), a) end
    for rp in pairs(rb) do redis.call("SREM", K.provider_consumers(rp), b) end
    for rp in pairs(ra) do redis.call("SADD", K.provider_consumers(rp), b) end
    for rp in pairs(rb) do redis.call("SADD", K.provider_consumers(rp), a) end
    redis.call("DEL", ka, kb)
    if #fb > 0 then redis.call("HSET", ka, unpack(fb)) end
    if #fa > 0 then redis.call("HSET", kb, unpack(fa)) end
end

-- A move ends in ``status``: its record says so, its instance makes none, and its
-- hosts have it no more under way.
local function move_close(uuid, mig, status, now)
    local mkey = K.migration(mig)
    local m = redis.call("HMGET", mkey, "source_compute", "dest_compute")
    redis.call("HSET", mkey, "status", status, "updated_at", now)
    redis.call("ZREM", K.move_deadlines, mig)
    redis.call("ZREM", K.moves_finished, mig)
    redis.call("HDEL", K.instance(uuid), "migration", "move_host", "move_node", "move_from",
               "move_from_node")
    if m[1] then redis.call("SREM", K.host_migrations(m[1]), mig) end
    if m[2] and m[2] ~= "" then redis.call("SREM", K.host_migrations(m[2]), mig) end
end

-- Whether a delete of the instance is under way (its host's agent was asked to destroy
-- it there): no step of a move changes its host or task_state then, or the delete
-- would reach a host the record no longer names; the delete ends the move (move_end).
local function being_deleted(uuid)
    return redis.call("HGET", K.instance(uuid), "task_state") == "deleting"
end

-- Give a move's claim back: the instance holds its source's side again (on its own
-- host, what it held before: ``old_allocs``) and no longer counts on the destination.
local function move_restore(uuid, mig, same, old_allocs, project, user)
    if same then
        replace_allocations(uuid, old_allocs, project, user)
    else
        drop_allocations(uuid)
        swap_consumers(uuid, mig)
        redis.call("HDEL", K.consumer(uuid), "migration", "instance")
    end
    group_count_drop(uuid, "group_move_host")
end

-- The instance holds ``quota`` ("cores ram_mb") against its project from now on.
local function move_quota(project, uuid, quota)
    if not quota or quota == "" then return end
    local held_key = K.quota_held(project)
    local before = redis.call("HGET", held_key, uuid)
    if not before or before == quota then return end
    local c0, r0 = string.match(before, "(%d+) (%d+)")
    local c1, r1 = string.match(quota, "(%d+) (%d+)")
    local used = K.quota_used(project)
    redis.call("HINCRBY", used, "cores", tonumber(c1) - tonumber(c0))
    redis.call("HINCRBY", used, "ram_mb", tonumber(r1) - tonumber(r0))
    redis.call("HSET", held_key, uuid, quota)
    redis.call("HSET", K.instance(uuid), "quota", quota)
end

-- An instance ends (``ender``: the host whose side ends with it) while a move of it is
-- under way: the move fails, and what the other host holds stays held for that host
-- (under the migration's consumer) until its agent says the VM is gone there. Before
-- the move finished, the instance's own consumer holds the destination's side: the two
-- are exchanged first, so that the instance's consumer holds the ender's side, which
-- ends with the instance as any other claim.
local function move_end(uuid, ender, now)
    local mig = redis.call("HGET", K.instance(uuid), "migration")
    if not mig then return end
    local mkey = K.migration(mig)
    local m = redis.call("HMGET", mkey, "status", "source_compute", "dest_compute", "kind")
    if m[1] and not MOVE_FINAL[m[1]] then
        local dest = m[3] or ""  -- the host asked for, while it waits: nothing there yet
        if dest ~= "" and dest ~= m[2] and not MOVE_WAITING[m[1]] then
            local other = dest
            if ender == dest then
                other = m[2]
            else
                swap_consumers(uuid, mig)
            end
            hold_consumer(mig, uuid, other, mig)
        end
        local failed = (m[4] == "resize" or m[4] == "migration") and "error" or "failed"
        move_close(uuid, mig, failed, now)
        redis.call("HSET", mkey, "fault", "the server ended while it moved")
    end
    redis.call("HDEL", K.instance(uuid), "migration", "move_host", "move_node", "move_from",
               "move_from_node")
end

-- End an instance in ERROR or DELETED: its allocations and quota are released and it
-- leaves every index. inst = {project=, host=, node=} as the record holds them; detail
-- goes into the history, marked unpublished when its boot request never went out.
local function end_instance(uuid, inst, state, fault, now, max_events, detail)
    local ikey = K.instance(uuid)
    move_end(uuid, inst.host or "", now)
    drop_allocations(uuid)
    group_unclaim(uuid)
    batch_unclaim(uuid)
    release_quota(inst.project, uuid)
    unbuild(uuid, inst.host)
    undelete(uuid, inst.host)
    redis.call("HSET", ikey, "state", state, "task_state", "", "updated_at", now)
    redis.call("HDEL", ikey, "quota")
    if fault ~= "" then redis.call("HSET", ikey, "fault", fault) end
    if state == "DELETED" then
        redis.call("HSET", ikey, "deleted_at", now)
        redis.call("SREM", K.project_instances(inst.project), uuid)
        redis.call("ZREM", K.live_instances, uuid)
        deleted_index(K.project_deleted(inst.project), uuid, now, DELETED_KEPT_PROJECT)
        deleted_index(K.deleted_instances, uuid, now, nil)
        local group = redis.call("HGET", ikey, "group")
        if group then redis.call("SREM", K.group_members(group), uuid) end
    end
    redis.call("ZREM", K.deadlines, uuid)
    if outbox_drop(uuid) then detail.unpublished = true end
    add_event(uuid, now, string.lower(state), inst.host, inst.node, detail, max_events)
    -- a multi-create not permitted yet: all or none of it is placed
    local others = batch_end(uuid, state)
    if #others > 0 then
        local batch = redis.call("HGET", ikey, "batch")
        for _, other in ipairs(others) do
            local o = redis.call("HMGET", K.instance(other), "state", "project_id", "host", "node")
            if o[1] == "BUILD" then
                end_instance(other, {project = o[2], host = o[3], node = o[4]}, "ERROR",
                             batch_fault(fault, now, batch, uuid), now, max_events,
                             {reason = "batch", member = uuid})
            end
        end
    end
end

-- Append host to the JSON list in the instance's tried_hosts field, once.
local function add_tried_host(ikey, host)
    local tried = cjson.decode(redis.call("HGET", ikey, "tried_hosts") or "[]")
    for _, seen in ipairs(tried) do
        if seen == host then return end
    end
    tried[#tried + 1] = host
    redis.call("HSET", ikey, "tried_hosts", cjson.encode(tried))
end

-- A compute service record as the scripts return it (nil fields left out; times as
-- the strings stored, which JSON numbers would round), or nil.
local function service_record(host)
    local f = redis.call("HMGET", K.service(host), "id", "seq", "disabled", "disabled_reason",
                         "forced_down", "created_at", "updated_at", "zone")
    if not f[1] then return nil end
    return {host = host, id = f[1], seq = tonumber(f[2]), disabled = f[3] == "1",
            disabled_reason = f[4] or nil, forced_down = f[5] == "1",
            created_at = f[6] or nil, updated_at = f[7] or nil, zone = f[8] or nil}
end

-- Why a host's service takes no new boots ("disabled: <reason>", "forced down"), or nil.
local function service_closed(host)
    local f = redis.call("HMGET", K.service(host), "disabled", "forced_down", "disabled_reason")
    if f[2] == "1" then return "forced down" end
    if f[1] == "1" then return "disabled" .. (f[3] and (": " .. f[3]) or "") end
    return nil
end

-- Members of a class's consumer set looked at beyond the tried hosts: the whole set
-- when it is that small, a random sample of it otherwise.
local SAMPLE = 4

-- An agent that consumes class cls now, is alive, takes new boots and is not among the
-- tried hosts, or nil. O(tried hosts + SAMPLE): a member whose heartbeat expired is
-- dropped. (SRANDMEMBER before writes is fine: Redis replicates a script's effects.)
-- Used by claims (allocate.lua) and moves (move_claim.lua).
local function alternate(cls, tried, ntried)
    local key = K.class_consumers(cls)
    for _, other in ipairs(redis.call("SRANDMEMBER", key, ntried + SAMPLE)) do
        if not tried[other] then
            if redis.call("EXISTS", K.agent(other)) == 0 then
                redis.call("SREM", key, other)
            elseif not service_closed(other) then
                return other
            end
        end
    end
    return nil
end

-- Sharing providers ----------------------------------------------------------------

-- The trait that makes a provider share its inventory with the trees of its aggregates.
local SHARES_VIA_AGGREGATE = "MISC_SHARES_VIA_AGGREGATE"

-- Keep the cell's index of sharing providers in step with one provider's traits,
-- read from its traits set after every change of it (the index is what agents read:
-- O(sharing providers), never O(providers)).
local function index_sharing(uuid)
    if redis.call("SISMEMBER", K.provider_traits(uuid), SHARES_VIA_AGGREGATE) == 1 then
        redis.call("SADD", K.sharing_providers, uuid)
    else
        redis.call("SREM", K.sharing_providers, uuid)
    end
end

-- Why sharing provider rp may not serve a claim on the tree of root (guard: the
-- claim's aggregate rules, which apply to it too, as in Placement), or nil: it must
-- still carry the trait and share an aggregate with the root. O(aggregates named).
local function sharing_broken(rp, root, guard)
    if redis.call("SISMEMBER", K.provider_traits(rp), SHARES_VIA_AGGREGATE) == 0 then
        return "not a sharing provider (no trait " .. SHARES_VIA_AGGREGATE .. ")"
    end
    local akey = K.provider_aggregates(rp)
    local function member(a) return redis.call("SISMEMBER", akey, a) == 1 end
    local shares = false
    for _, a in ipairs(redis.call("SMEMBERS", K.provider_aggregates(root))) do
        if member(a) then shares = true; break end
    end
    if not shares then return "in no aggregate of provider " .. root end
    for _, a in ipairs(guard.all) do
        if not member(a) then return "not in aggregate " .. a end
    end
    for _, group in ipairs(guard.any) do
        local found = false
        for _, a in ipairs(group) do if member(a) then found = true; break end end
        if not found then return "in none of the aggregates " .. table.concat(group, ", ") end
    end
    for _, a in ipairs(guard.none) do
        if member(a) then return "in aggregate " .. a end
    end
    return nil
end

-- Why a claim's guard (ClaimGuard: the aggregate rules its node's root provider must
-- satisfy, and the sharing providers it takes from) refuses it: the failure reply, or
-- nil. ``shared`` (a table, or nil) gets each sharing provider it checked.
local function guard_refusal(guard, shared)
    local akey = K.provider_aggregates(guard.root)
    local function member(a) return redis.call("SISMEMBER", akey, a) == 1 end
    for _, a in ipairs(guard.all) do
        if not member(a) then
            return fail("rule_broken", {provider = guard.root, reason = "not in aggregate " .. a})
        end
    end
    for _, group in ipairs(guard.any) do
        local found = false
        for _, a in ipairs(group) do if member(a) then found = true; break end end
        if not found then
            return fail("rule_broken", {provider = guard.root,
                reason = "in none of the aggregates " .. table.concat(group, ", ")})
        end
    end
    for _, a in ipairs(guard.none) do
        if member(a) then
            return fail("rule_broken", {provider = guard.root, reason = "in aggregate " .. a})
        end
    end
    -- Sharing providers (docs/shared-providers.rst): each still serves the root's tree.
    for _, rp in ipairs(guard.sharing or {}) do
        local broken = sharing_broken(rp, guard.root, guard)
        if broken then return fail("rule_broken", {provider = rp, reason = broken}) end
        if shared then shared[rp] = true end
    end
    return nil
end

-- Why allocating ``new`` ({rp: {rc: n}}) is refused, or nil, checked before anything
-- is written: each provider exists at the generation seen (``gens``; a sharing
-- provider in ``shared`` may have moved its usage only since, as the capacity check
-- reads that), each amount suits its inventory's units, and ``held`` (what the
-- consumer will hold, by provider and class) fits beside what others use there
-- (``old``: what the consumer holds now, given back first).
local function allocation_refusal(new, held, old, gens, shared)
    for rp, amounts in pairs(new) do
        local rkey = K.provider(rp)
        local state = redis.call("HMGET", rkey, "generation", "inventory_generation")
        local gen = state[1]
        if not gen then return fail("provider_not_found", {provider = rp}) end
        local seen = gens[rp] and tonumber(gens[rp])
        if seen and seen ~= tonumber(gen)
                and not (shared[rp] and seen >= (tonumber(state[2]) or 0)) then
            return fail("provider_conflict", {provider = rp, expected = gens[rp],
                                              current = tonumber(gen)})
        end
        for rc, n in pairs(amounts) do
            local fields = redis.call("HMGET", rkey, "i:" .. rc, "u:" .. rc)
            local inv = parse_inventory(fields[1])
            if not inv then
                return fail("invalid_amount", {provider = rp, resource_class = rc, amount = n,
                            reason = "the provider has no inventory of " .. rc})
            end
            if n < inv.min_unit or n > inv.max_unit or n % inv.step_size ~= 0 then
                return fail("invalid_amount", {provider = rp, resource_class = rc, amount = n,
                            reason = string.format("must be within %d..%d in steps of %d",
                                                   inv.min_unit, inv.max_unit, inv.step_size)})
            end
            local used = tonumber(fields[2] or 0)
            local mine = old[rp] and old[rp][rc] or 0
            local cap = capacity(inv)
            if used - mine + held[rp][rc] > cap then
                return fail("capacity", {provider = rp, resource_class = rc, requested = n,
                                         used = used - mine, capacity = cap})
            end
        end
    end
    return nil
end

-- Host aggregates --------------------------------------------------------------

-- The UUID of aggregate ``id`` (Nova's integer), or nil.
local function aggregate_uuid(id)
    if id == "seq" then return nil end
    return redis.call("HGET", K.aggregate_ids, id)
end

local function aggregate_metadata(uuid)
    local raw = redis.call("HGET", K.aggregate(uuid), "metadata")
    return raw and cjson.decode(raw) or {}
end

-- The zones other than ``zone`` that some of ``hosts`` are in already through an
-- aggregate other than ``self``, as Nova words them: "['az1', 'az2']" (empty: "").
local function zone_conflicts(hosts, zone, self)
    local seen, found = {}, {}
    for _, host in ipairs(hosts) do
        for _, other in ipairs(redis.call("SMEMBERS", K.host_aggregates(host))) do
            local theirs = other ~= self and aggregate_metadata(other).availability_zone
            if theirs and theirs ~= zone and not seen[theirs] then
                seen[theirs] = true
                found[#found + 1] = "'" .. theirs .. "'"
            end
        end
    end
    if #found == 0 then return "" end
    table.sort(found)
    return "[" .. table.concat(found, ", ") .. "]"
end

-- Write a new BUILD instance's record with its indexes (project, group, deadline) and
-- its "accepted" event; ``detail`` goes into that event. Returns its outbox score.
-- The caller reserved its quota and checked everything before.
local function record_instance(uuid, record, project, group, cores, ram, deadline, now,
                               detail, max_events)
    local fields = {"state", "BUILD", "task_state", "scheduling", "attempts", 0,
                    "quota", cores .. " " .. ram, "deadline", deadline, "created_at", now,
                    "updated_at", now}
    for field, value in pairs(record) do
        fields[#fields + 1] = field
        fields[#fields + 1] = value
    end
    redis.call("HSET", K.instance(uuid), unpack(fields))
    redis.call("SADD", K.project_instances(project), uuid)
    redis.call("ZADD", K.live_instances, now, uuid)
    if group ~= "" then redis.call("SADD", K.group_members(group), uuid) end
    redis.call("ZADD", K.deadlines, deadline, uuid)
    local outbox = outbox_add(uuid)  -- until its publish is confirmed
    detail.deadline = tonumber(deadline)
    add_event(uuid, now, "accepted", nil, nil, detail, max_events)
    return outbox
end

-- The zones a host serves: its agent's own zone and its aggregate's, if it has them.
local function host_zones(host)
    local zones, seen = {}, {}
    local own = redis.call("HGET", K.service(host), "zone")
    if own then seen[own] = true; zones[1] = own end
    for _, agg in ipairs(redis.call("SMEMBERS", K.host_aggregates(host))) do
        local zone = aggregate_metadata(agg).availability_zone
        if zone and not seen[zone] then seen[zone] = true; zones[#zones + 1] = zone end
    end
    return zones
end

-- Keep a host in the zones it serves (zone:<zone>:hosts) until ``expires``, when its
-- heartbeat runs out, while its service is enabled and not forced down; take it out
-- of them otherwise (``expires`` nil: it is not beating). Members expired by ``now``
-- leave as they are passed, so a zone's set holds about its live hosts.
local function refresh_zones(host, expires, now)
    local open = expires and not service_closed(host)
    for _, zone in ipairs(host_zones(host)) do
        local key = K.zone_hosts(zone)
        if open then
            redis.call("ZADD", key, expires, host)
        else
            redis.call("ZREM", key, host)
        end
        redis.call("ZREMRANGEBYSCORE", key, "-inf", "(" .. now)
    end
end

-- JSON text -----------------------------------------------------------------------

-- A script that changes items of a map a record keeps as JSON (an instance's extra)
-- works on its text, never decodes the record: cjson writes an empty list back as an
-- object (fakeredis the other way round), rounds numbers to 14 digits, and refuses
-- the lone UTF-16 surrogates that records made before the API refused them still
-- hold. Keys and values stay JSON text, spelled as the record's encoder spelled them
-- (canonical JSON, see qsched/ledger/redis.py), and are compared as text.

-- The index of the last character of the JSON value that starts at raw[i].
local function json_value_end(raw, i)
    local c = string.sub(raw, i, i)
    if c == '"' then
        local j = i + 1
        while true do
            local k = string.find(raw, '["\\]', j)
            if string.sub(raw, k, k) == '"' then return k end
            j = k + 2  -- past the escaped character
        end
    elseif c == "{" or c == "[" then
        local depth, j = 0, i
        while true do
            local k = string.find(raw, '["{}%[%]]', j)
            local d = string.sub(raw, k, k)
            if d == '"' then
                j = json_value_end(raw, k) + 1
            else
                depth = depth + ((d == "{" or d == "[") and 1 or -1)
                if depth == 0 then return k end
                j = k + 1
            end
        end
    end
    return string.find(raw, "[%s,}%]]", i) - 1  -- a number, true, false or null
end

-- The members of the JSON object raw as {key text = value text}, or nil if raw is
-- not an object. One pass over the text.
local function json_members(raw)
    local i = string.find(raw, "%S")
    if not i or string.sub(raw, i, i) ~= "{" then return nil end
    local members = {}
    i = string.find(raw, "%S", i + 1)
    while string.sub(raw, i, i) == '"' do
        local key_end = json_value_end(raw, i)
        local value = string.find(raw, "%S", string.find(raw, ":", key_end + 1, true) + 1)
        local value_end = json_value_end(raw, value)
        members[string.sub(raw, i, key_end)] = string.sub(raw, value, value_end)
        i = string.find(raw, "%S", value_end + 1)
        if string.sub(raw, i, i) == "," then i = string.find(raw, "%S", i + 1) end
    end
    return members
end

-- The JSON object of members ({key text = value text}), keys in order.
local function json_object(members)
    local keys = {}
    for key in pairs(members) do keys[#keys + 1] = key end
    table.sort(keys)
    for n, key in ipairs(keys) do keys[n] = key .. ":" .. members[key] end
    return "{" .. table.concat(keys, ",") .. "}", #keys
end
