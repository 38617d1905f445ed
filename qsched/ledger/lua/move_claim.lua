-- A destination's claim of a move (docs/moves.rst), in one step: every rule a boot's
-- claim checks (the host's service, the host rule, the aggregates, generations,
-- capacity, the server group's hard policy), then the instance's consumer takes the
-- destination's resources and the migration's consumer the source's. A resize on its
-- own host holds the larger of the two flavors per class in the instance's consumer
-- alone, never both. Idempotent: the same claim again answers ``already``.
-- KEYS[1]  the instance's consumer key
-- ARGV     prefix, migration, instance, allocations JSON (canonical), provider
--          generations JSON ("" = not checked), host, node, now, max_events, guard JSON
--          ("" = none; as allocate.lua's), the scheduling class it was placed for
local mig, uuid, allocs_json, gens_json = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local host, node, now, max_events = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local guard_json, claimed_class = ARGV[10], ARGV[11]
local mkey, ikey = K.migration(mig), K.instance(uuid)
local m = redis.call("HMGET", mkey, "status", "instance_uuid", "source_compute",
                     "source_node", "dest_compute", "dest_node", "same_host", "tried",
                     "new_class", "kind", "new_allocs", "created_at", "asked")
if not m[1] or m[2] ~= uuid then return fail("migration_not_found", {migration = mig}) end
local inst = redis.call("HMGET", ikey, "state", "migration", "project_id", "user_id", "hosts")
if inst[1] ~= "ACTIVE" or inst[2] ~= mig then
    return fail("not_waiting", {instance = uuid, state = inst[1] or "gone", host = host})
end
local source, kind = m[3], m[10]
if being_deleted(uuid) then  -- its delete ends the move
    return fail("not_waiting", {instance = uuid, state = "deleting", host = host})
end
if not MOVE_WAITING[m[1]] or m[13] == "abort" then  -- an abort asked: its end is near
    if m[5] == host and m[6] == node and m[11] == allocs_json then
        return reply({already = true, status = m[1]})
    end
    return fail("not_waiting", {instance = uuid, state = m[1], host = m[5] or ""})
end
if claimed_class ~= "" and m[9] ~= "" and m[9] ~= claimed_class then
    return fail("not_its_request", {instance = uuid, recorded = m[9], claimed = claimed_class})
end
local why = {instance = uuid, host = host, node = node, migration = mig,
             age = tonumber(now) - tonumber(m[12] or now)}

-- A live agent other than this host that consumes the move's class and is neither its
-- source (unless a resize may stay there) nor a host that tried it, or "": a refusal
-- names it, and with none the move can go nowhere now.
local function move_alternate()
    local tried, ntried = {[host] = true}, 1
    if m[7] ~= "1" and source ~= host then tried[source], ntried = true, 2 end
    for _, seen in ipairs(cjson.decode(m[8] or "[]")) do
        if not tried[seen] then tried[seen], ntried = true, ntried + 1 end
    end
    return alternate(m[9], tried, ntried) or ""
end
-- where it may go: the host asked for, never its own unless a resize may stay there,
-- never a host that tried it, and the host rule its boot asked for
if m[5] and m[5] ~= "" and m[5] ~= host then
    why.rule, why.only, why.holder = "only", {m[5]}, m[5]
    return fail("host_rule", why)
end
local same = host == source
if same and m[7] ~= "1" then
    why.rule, why.alternate = "own", move_alternate()
    return fail("host_rule", why)
end
for _, seen in ipairs(cjson.decode(m[8] or "[]")) do
    if seen == host then
        why.alternate = move_alternate()
        return fail("move_tried_host", why)
    end
end
local closed = service_closed(host)
if closed then return fail("service_disabled", {host = host, why = closed}) end
if m[5] == "" and inst[5] then  -- an admin's named host stands above the boot's rule
    local rule = cjson.decode(inst[5])
    local allowed = #rule.only == 0
    for _, h in ipairs(rule.only) do if h == host then allowed = true end end
    for _, h in ipairs(rule.never) do if h == host then allowed = false end end
    if not allowed then
        why.rule, why.only, why.never = "hosts", rule.only, rule.never
        return fail("host_rule", why)
    end
end
if guard_json ~= "" then
    local broken = guard_refusal(cjson.decode(guard_json), nil)
    if broken then return broken end
end

local ckey = K.consumer(uuid)
local cur = redis.call("HMGET", ckey, "allocs")
local old = cur[1] and cjson.decode(cur[1]) or {}
local new = cjson.decode(allocs_json)
-- on its own host the instance keeps one consumer: the larger amount per class
local held = new
if same then
    held = {}
    for rp, amounts in pairs(old) do
        held[rp] = {}
        for rc, n in pairs(amounts) do held[rp][rc] = n end
    end
    for rp, amounts in pairs(new) do
        held[rp] = held[rp] or {}
        for rc, n in pairs(amounts) do held[rp][rc] = math.max(held[rp][rc] or 0, n) end
    end
end
local gens = gens_json ~= "" and cjson.decode(gens_json) or {}
-- on its own host, what the instance holds there now makes room for what it will hold
local refused = allocation_refusal(new, held, same and old or {}, gens, {})
if refused then return refused end
-- the hard policy of its server group, on the destination (on its own host it counts
-- there already)
if not same then
    local refused = group_refusal(uuid, host)
    if refused then return refused end
end

local project, user = inst[3], inst[4]
if same then
    replace_allocations(uuid, cjson.encode(held), project, user)
elseif source == "" then  -- an unshelve: nothing is held anywhere else
    replace_allocations(uuid, allocs_json, project, user)
    group_claim(uuid, host, "group_move_host")
else
    swap_consumers(uuid, mig)  -- the migration's consumer holds the source's side
    redis.call("HSET", K.consumer(mig), "migration", mig, "instance", uuid)
    replace_allocations(uuid, allocs_json, project, user)
    -- it counts on its destination too until the move settles: two moves can never
    -- fill one host past its group's rule
    group_claim(uuid, host, "group_move_host")
end
local status = (kind == "live-migration" and "preparing") or "migrating"
local task = ({resize = "resize_migrating", migration = "resize_migrating",
               ["live-migration"] = "migrating", evacuation = "rebuild_spawning",
               unshelve = "spawning"})[kind]
redis.call("HSET", mkey, "status", status, "dest_compute", host, "dest_node", node,
           "old_allocs", cur[1] or "{}", "new_allocs", allocs_json, "updated_at", now)
redis.call("SADD", K.host_migrations(host), mig)
redis.call("HSET", ikey, "task_state", task, "move_host", host, "move_node", node,
           "updated_at", now)
add_event(uuid, now, "move_claimed", host, node,
          {migration = mig, kind = kind, source = source, allocations = new}, max_events)
return reply({status = status})
