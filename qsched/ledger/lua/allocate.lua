-- Replace a consumer's allocations as one unit, or claim for an instance.
-- KEYS[1]  the consumer key (routes the script to the cell's slot)
-- ARGV     prefix, consumer, expected consumer generation ("" = new consumer),
--          project, user, allocations JSON {rp: {rc: n}} (canonical, sorted),
--          provider generations JSON ("" = not checked), claim ("1" = guard on the
--          instance record and mark it claimed), host, node, now, max_events,
--          max_handbacks (a claim: how often hosts that tried it may hand it back).
--          A claim is refused to a host whose service is disabled or forced down.
--          Then the guard JSON {root, all: [], any: [[]], none: []} ("" = none):
--          aggregate rules the root provider must satisfy, checked with everything else;
--          its "sharing" lists the sharing providers the claim takes from.
--          For those (a claim only, each checked to serve the root's tree), a generation
--          read since the provider's inventory last changed is not a conflict: only its
--          usage can have moved since, and the capacity check below reads that here, in
--          the same atomic step (docs/shared-providers.rst). Every other provider, and
--          a view of a sharing one older than its inventory, conflicts on any change.
--          Last the scheduling class the claim was placed for ("" = not checked): a
--          claim must be for the class the front door recorded for the instance, or
--          it is refused (not_its_request) before anything is checked or written.
local consumer, expected, project, user = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local allocs_json, gens_json, claim = ARGV[6], ARGV[7], ARGV[8] == "1"
local host, node, now, max_events = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local max_handbacks = tonumber(ARGV[13]) or 0
local claimed_class = ARGV[15] or ""
local ckey = K.consumer(consumer)

-- The first host of a host rule's ``only`` that is not among the tried hosts, is alive
-- and takes new boots, or nil: the alternates of a request that may run there only.
local function alternate_of(only, tried)
    for _, other in ipairs(only) do
        if not tried[other] and redis.call("EXISTS", K.agent(other)) == 1
                and not service_closed(other) then
            return other
        end
    end
    return nil
end

-- Alternates: a host that held this request and gave it back (its spawn failed, its
-- claim was taken back) may not claim it again while another host could take it: it
-- hands the request back, up to max_handbacks times in all. Returns the failure reply.
-- Only a host its host rule (``rule``, decoded; nil: none) allows is an alternate.
local function hand_back(ikey, tried_json, handbacks, rule)
    if tonumber(handbacks or 0) >= max_handbacks then return nil end
    local tried, ntried = {}, 0
    for _, seen in ipairs(cjson.decode(tried_json)) do
        tried[seen], ntried = true, ntried + 1
    end
    if not tried[host] then return nil end
    local other
    if rule and #rule.only > 0 then
        other = alternate_of(rule.only, tried)
    else
        for _, h in ipairs(rule and rule.never or {}) do
            if not tried[h] then tried[h], ntried = true, ntried + 1 end
        end
        local cls = cjson.decode(redis.call("HGET", ikey, "extra") or "{}").scheduling_class
        if type(cls) ~= "string" then return nil end  -- not a front door's record
        other = alternate(cls, tried, ntried)
    end
    if not other then return nil end
    local n = redis.call("HINCRBY", ikey, "handbacks", 1)
    local detail = {alternate = other, handbacks = n, max_handbacks = max_handbacks}
    add_event(consumer, now, "handed_back", host, "", detail, max_events)
    detail.instance, detail.host = consumer, host
    return fail("tried_host", detail)
end

-- The record is the truth, not the message that asked for the claim: a claim placed
-- for another scheduling class than the one the front door recorded (a message forged,
-- or published with another flavor's amounts) is refused. ``recorded`` is the record's
-- ``class``; a record made before that field existed keeps it in ``extra`` only; one
-- no front door made (a bench's, a test's) has none, and is not checked.
local function class_refusal(ikey, recorded)
    if claimed_class == "" then return nil end
    if not recorded then
        local extra = cjson.decode(redis.call("HGET", ikey, "extra") or "{}")
        recorded = type(extra.scheduling_class) == "string" and extra.scheduling_class or nil
        if not recorded then return nil end
    end
    if recorded == claimed_class then return nil end
    return fail("not_its_request", {instance = consumer, recorded = recorded,
                                    claimed = claimed_class})
end

-- Host rules (docs/server-groups.rst, "Host rules"): the hosts a boot may run on
-- (same_host, an admin's 2.74 host), those it must not (different_host), and its node.
-- O(hosts the rule names). A refusal names a host of ``only`` whose agent lives, for
-- the agent to forward the request to, and is counted on the record with the group
-- refusals (the agents park a request at every few).
local function host_rule_refusal(ikey, rule)
    local why = {instance = consumer, host = host, node = node}
    local allowed = #rule.only == 0
    for _, h in ipairs(rule.only) do
        if h == host then allowed = true; break end
    end
    if not allowed then
        why.rule, why.only = "only", rule.only
        for _, h in ipairs(rule.only) do
            if redis.call("EXISTS", K.agent(h)) == 1 then why.holder = h; break end
        end
    else
        for _, h in ipairs(rule.never) do
            if h == host then why.rule = "never"; break end
        end
        if not why.rule and rule.node ~= cjson.null and rule.node ~= node then
            why.rule, why.requested_node = "node", rule.node
        end
    end
    if not why.rule then return nil end
    why.refusals = redis.call("HINCRBY", ikey, "group_refusals", 1)
    return fail("host_rule", why)
end

local cur = redis.call("HMGET", ckey, "generation", "allocs", "project")
local cur_gen = tonumber(cur[1])

if claim then
    local ikey = K.instance(consumer)
    local inst = redis.call("HMGET", ikey, "state", "host", "node", "project_id", "user_id",
                            "tried_hosts", "handbacks", "hosts", "class")
    if not inst[1] then return fail("instance_not_found", {instance = consumer}) end
    project, user = inst[4], inst[5]  -- a claim allocates for the instance's owner
    if inst[1] ~= "BUILD" then
        return fail("not_waiting", {instance = consumer, state = inst[1], host = inst[2] or ""})
    end
    local forged = class_refusal(ikey, inst[9])
    if forged then return forged end
    if inst[2] and inst[2] ~= "" then
        if inst[2] == host and inst[3] == node and cur[2] == allocs_json then
            local again = {generation = cur_gen, already = true}
            batch_claim(consumer, again)
            return reply(again)
        end
        return fail("not_waiting", {instance = consumer, state = inst[1], host = inst[2] or ""})
    end
    -- Maintenance: a disabled or forced-down service takes no new boot.
    local closed = service_closed(host)
    if closed then return fail("service_disabled", {host = host, why = closed}) end
    local rule = inst[8] and cjson.decode(inst[8])
    if rule then
        local refused = host_rule_refusal(ikey, rule)
        if refused then return refused end
    end
    if inst[6] then
        local refused = hand_back(ikey, inst[6], inst[7], rule)
        if refused then return refused end
    end
end

if expected == "" then
    if cur_gen then
        return fail("consumer_conflict", {consumer = consumer, expected = cjson.null,
                                          current = cur_gen})
    end
elseif cur_gen ~= tonumber(expected) then
    return fail("consumer_conflict", {consumer = consumer, expected = tonumber(expected),
                                      current = cur_gen or cjson.null})
end

local shared = {}  -- the sharing providers the guard checked: usage-only staleness is fine
if ARGV[14] and ARGV[14] ~= "" then
    local broken = guard_refusal(cjson.decode(ARGV[14]), claim and shared or nil)
    if broken then return broken end
end

local new = cjson.decode(allocs_json)
local old = cur[2] and cjson.decode(cur[2]) or {}
local gens = gens_json ~= "" and cjson.decode(gens_json) or {}

-- Check everything before writing anything: all of it happens or none.
local refused = allocation_refusal(new, new, old, gens, shared)
if refused then return refused end

-- The last check of a claim: the hard policy of the instance's server group.
if claim then
    local refused = group_refusal(consumer, host)
    if refused then return refused end
end

drop_allocations(consumer)
local touched = {}
for rp, amounts in pairs(new) do
    local rkey = K.provider(rp)
    for rc, n in pairs(amounts) do
        redis.call("HINCRBY", rkey, "u:" .. rc, n)
        redis.call("HINCRBY", K.project_usage(project), rc, n)
    end
    redis.call("SADD", K.provider_consumers(rp), consumer)
    -- drop_allocations already bumped the providers the consumer left or kept
    if not old[rp] then redis.call("HINCRBY", rkey, "generation", 1) end
    touched[#touched + 1] = rp
end

local gen = (cur_gen or 0) + 1
if #touched == 0 then
    redis.call("DEL", ckey)
    gen = cjson.null
else
    redis.call("HSET", ckey, "generation", gen, "allocs", allocs_json,
               "project", project, "user", user)
end

local done = {generation = gen}
if claim then
    local ikey = K.instance(consumer)
    redis.call("HSET", ikey, "host", host, "node", node, "task_state", "spawning",
               "updated_at", now)
    redis.call("SADD", K.host_building(host), consumer)
    group_claim(consumer, host)
    batch_claim(consumer, done)
    outbox_drop(consumer)  -- its request arrived: nothing left to publish
    add_event(consumer, now, "claimed", host, node, new, max_events)
end
return reply(done)
