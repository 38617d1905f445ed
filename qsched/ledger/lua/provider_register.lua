-- Create or update many providers at once (an agent registering its nodes).
-- Idempotent: a provider already as described is left alone; a change bumps its
-- generation once. Parents come before their children in the batch.
-- KEYS[1]  the providers set (routes the script to the cell's slot)
-- ARGV     prefix, now, JSON [{uuid, name, parent, host, inv: {rc: spec}, traits: [], aggs: []}]
-- A root provider of a host ("host" not "") joins the host's roots and the hypervisors
-- (with the next integer id the first time; the host in its hash), and its aggregates
-- are its own ("aggs", kept as "own_aggs") plus the host's (host:<host>:aggs, which
-- the aggregate API writes).
local now, batch = ARGV[2], cjson.decode(ARGV[3])

local function same_members(key, wanted)
    local have = redis.call("SMEMBERS", key)
    if #have ~= #wanted then return false end
    local set = {}
    for _, m in ipairs(have) do set[m] = true end
    for _, m in ipairs(wanted) do if not set[m] then return false end end
    return true
end

local function replace_members(key, wanted)
    redis.call("DEL", key)
    for _, m in ipairs(wanted) do redis.call("SADD", key, m) end
end

-- Check everything first: a bad provider leaves the whole batch unwritten.
local known = {}
for _, p in ipairs(batch) do
    local rkey = K.provider(p.uuid)
    local owner = redis.call("HGET", K.provider_names, p.name)
    if owner and owner ~= p.uuid then
        return fail("provider_exists", {field = "name", value = p.name})
    end
    if p.parent ~= "" and not known[p.parent] and redis.call("EXISTS", K.provider(p.parent)) == 0 then
        return fail("provider_not_found", {provider = p.parent})
    end
    for rc, spec in pairs(p.inv) do
        local used = tonumber(redis.call("HGET", rkey, "u:" .. rc) or 0)
        local cap = capacity(parse_inventory(spec))
        if used > cap then
            return fail("inventory_in_use", {provider = p.uuid, resource_class = rc,
                                             used = used, capacity = cap})
        end
    end
    known[p.uuid] = true
end

local out = {}
for i, p in ipairs(batch) do
    local rkey = K.provider(p.uuid)
    local changed = false
    if redis.call("EXISTS", rkey) == 0 then
        local root = p.uuid
        if p.parent ~= "" then
            root = redis.call("HGET", K.provider(p.parent), "root")
            redis.call("SADD", K.provider_children(p.parent), p.uuid)
        end
        redis.call("HSET", rkey, "name", p.name, "generation", 0, "parent", p.parent,
                   "root", root, "created_at", now)
        redis.call("HSET", K.provider_names, p.name, p.uuid)
        redis.call("SADD", K.providers, p.uuid)
    end
    local fields = redis.call("HGETALL", rkey)
    local usages = {}
    local inventory_changed = false
    for j = 1, #fields, 2 do
        local rc = string.match(fields[j], "^i:(.+)$")
        if rc and not p.inv[rc] then
            redis.call("HDEL", rkey, fields[j])
            changed, inventory_changed = true, true
        end
        local urc = string.match(fields[j], "^u:(.+)$")
        if urc then usages[urc] = tonumber(fields[j + 1]) end
    end
    for rc, spec in pairs(p.inv) do
        if redis.call("HGET", rkey, "i:" .. rc) ~= spec then
            redis.call("HSET", rkey, "i:" .. rc, spec)
            changed, inventory_changed = true, true
        end
    end
    if not same_members(K.provider_traits(p.uuid), p.traits) then
        replace_members(K.provider_traits(p.uuid), p.traits)
        index_sharing(p.uuid)
        changed = true
    end
    local aggs = p.aggs
    if p.parent == "" and p.host ~= "" then
        redis.call("SADD", K.host_roots(p.host), p.uuid)
        -- a host's root is one of Nova's hypervisors: an integer id once, its host
        if not redis.call("ZSCORE", K.hypervisors, p.uuid) then
            redis.call("ZADD", K.hypervisors, redis.call("INCR", K.hypervisor_seq), p.uuid)
        end
        if redis.call("HGET", rkey, "host") ~= p.host then
            redis.call("HSET", rkey, "host", p.host)
        end
        local own = cjson.encode(p.aggs)
        if redis.call("HGET", rkey, "own_aggs") ~= own then
            redis.call("HSET", rkey, "own_aggs", own)
        end
        local merged, seen = {}, {}
        for _, list in ipairs({p.aggs, redis.call("SMEMBERS", K.host_aggregates(p.host))}) do
            for _, a in ipairs(list) do
                if not seen[a] then seen[a] = true; merged[#merged + 1] = a end
            end
        end
        aggs = merged
    end
    if not same_members(K.provider_aggregates(p.uuid), aggs) then
        replace_members(K.provider_aggregates(p.uuid), aggs)
        changed = true
    end
    local gen
    if changed then
        gen = redis.call("HINCRBY", rkey, "generation", 1)
        if inventory_changed then  -- what a claim on a sharing one compares (allocate.lua)
            redis.call("HSET", rkey, "inventory_generation", gen)
        end
    else
        gen = tonumber(redis.call("HGET", rkey, "generation"))
    end
    out[i] = {generation = gen, usages = usages, root = redis.call("HGET", rkey, "root"),
              aggs = aggs}
end
return reply({providers = out})
