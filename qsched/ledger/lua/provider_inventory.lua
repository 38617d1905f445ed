-- Replace a provider's inventories, guarded by its generation.
-- KEYS[1]  the provider key
-- ARGV     prefix, uuid, generation, inventories JSON
--          {rc: "total reserved min_unit max_unit step_size allocation_ratio"}
local uuid, expected, wanted = ARGV[2], tonumber(ARGV[3]), cjson.decode(ARGV[4])
local rkey = K.provider(uuid)
local gen = tonumber(redis.call("HGET", rkey, "generation"))
if not gen then return fail("provider_not_found", {provider = uuid}) end
if gen ~= expected then
    return fail("provider_conflict", {provider = uuid, expected = expected, current = gen})
end
local fields = redis.call("HGETALL", rkey)
local stale = {}
for i = 1, #fields, 2 do
    local rc = string.match(fields[i], "^i:(.+)$")
    if rc then
        local used = tonumber(redis.call("HGET", rkey, "u:" .. rc) or 0)
        local inv = parse_inventory(wanted[rc])
        local cap = inv and capacity(inv) or 0
        if used > cap then
            return fail("inventory_in_use", {provider = uuid, resource_class = rc, used = used,
                                             capacity = cap})
        end
        if not inv then stale[#stale + 1] = fields[i] end
    end
end
for _, field in ipairs(stale) do redis.call("HDEL", rkey, field) end
for rc, spec in pairs(wanted) do redis.call("HSET", rkey, "i:" .. rc, spec) end
gen = redis.call("HINCRBY", rkey, "generation", 1)
-- what a claim on a sharing provider compares its view with (allocate.lua)
redis.call("HSET", rkey, "inventory_generation", gen)
return reply({generation = gen})
