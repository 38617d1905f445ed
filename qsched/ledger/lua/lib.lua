-- Shared helpers, prepended to every qsched script when it is loaded.
--
-- Keys: no script spells a key name. The loader puts before this file a prelude
-- generated from the Python Keyspace (qsched/ledger/keys.py): P, the cell's
-- prefix "qsched:{cell}:" (ARGV[1] of every script), and K, one builder per key:
-- K.instance(uuid), K.provider_consumers(rp), K.quota_held(project), ... for a
-- key with a variable part, K.outbox, K.deadlines, K.flavors, ... for a key of
-- the whole cell. Every key starts with P, so a cell stays in one cluster slot.
-- What each key holds and who writes it: the keyspace table in docs/ledger.rst.
-- tests/test_keyspace.py fails on a key fragment spelled in any .lua file.

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

-- Return what a holder reserved against its project's quota.
local function release_quota(project, holder)
    local held_key = K.quota_held(project)
    local held = redis.call("HGET", held_key, holder)
    if not held then return false end
    local cores, ram = string.match(held, "(%d+) (%d+)")
    local used = K.quota_used(project)
    redis.call("HINCRBY", used, "instances", -1)
    redis.call("HINCRBY", used, "cores", -tonumber(cores))
    redis.call("HINCRBY", used, "ram_mb", -tonumber(ram))
    redis.call("HDEL", held_key, holder)
    return true
end

-- Reserve one instance with cores and ram for holder; limits are -1 for none.
-- Returns nil on success or the failure reply.
local function reserve_quota(project, holder, cores, ram, defaults)
    local held_key = K.quota_held(project)
    if redis.call("HEXISTS", held_key, holder) == 1 then return nil end
    local limits = redis.call("HMGET", K.quota_limits(project),
                              "instances", "cores", "ram_mb")
    local used_key = K.quota_used(project)
    local used = redis.call("HMGET", used_key, "instances", "cores", "ram_mb")
    local names = {"instances", "cores", "ram"}
    local want = {1, cores, ram}
    for i = 1, 3 do
        local limit = tonumber(limits[i] or defaults[i])
        local u = tonumber(used[i] or 0)
        if limit >= 0 and u + want[i] > limit then
            return fail("quota", {resource = names[i], requested = want[i], used = u,
                                  limit = limit})
        end
    end
    redis.call("HINCRBY", used_key, "instances", 1)
    redis.call("HINCRBY", used_key, "cores", cores)
    redis.call("HINCRBY", used_key, "ram_mb", ram)
    redis.call("HSET", held_key, holder, cores .. " " .. ram)
    return nil
end

-- End an instance in ERROR or DELETED: its allocations and quota are released and it
-- leaves every index. inst = {project=, host=, node=} as the record holds them; detail
-- goes into the history, marked unpublished when its boot request never went out.
local function end_instance(uuid, inst, state, fault, now, max_events, detail)
    local ikey = K.instance(uuid)
    drop_allocations(uuid)
    release_quota(inst.project, uuid)
    unbuild(uuid, inst.host)
    undelete(uuid, inst.host)
    redis.call("HSET", ikey, "state", state, "task_state", "", "updated_at", now)
    redis.call("HDEL", ikey, "quota")
    if fault ~= "" then redis.call("HSET", ikey, "fault", fault) end
    if state == "DELETED" then
        redis.call("HSET", ikey, "deleted_at", now)
        redis.call("SREM", K.project_instances(inst.project), uuid)
    end
    redis.call("ZREM", K.deadlines, uuid)
    if outbox_drop(uuid) then detail.unpublished = true end
    add_event(uuid, now, string.lower(state), inst.host, inst.node, detail, max_events)
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
