-- One step of archive-deleted: take up to ``batch`` DELETED instances, oldest deletion
-- first, that ended before ``before`` and that nothing refers to any more, out of the
-- cell. Each one's record and history move, as one JSON text, into the staging hash
-- (K.archive_staged), where the caller reads them, writes them where operators keep
-- history and clears them (RedisInstances.archive_done): a caller that dies in between
-- leaves them staged, and the next run writes them first. O(log n + batch) per step.
-- KEYS[1]  the cell's index of DELETED instances
-- ARGV     prefix, before (deleted_at below it), batch, after (the member of the index
--          the step starts past; "" = the oldest), dry ("1": change nothing), now
local before, batch, after = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local dry, now = ARGV[5] == "1", ARGV[6]
local index = K.deleted_instances

-- Why a DELETED instance must stay (something may still read or change it), or nil.
-- A constant number of reads: its own keys and its host's and project's.
local function held(uuid, f)
    if f.state ~= "DELETED" then return "state " .. tostring(f.state) end
    if redis.call("EXISTS", K.consumer(uuid)) == 1 then return "holds allocations" end
    if redis.call("HEXISTS", K.quota_held(f.project_id), uuid) == 1 then
        return "holds quota"
    end
    if redis.call("ZSCORE", K.live_instances, uuid) then return "listed live" end
    if redis.call("SISMEMBER", K.project_instances(f.project_id), uuid) == 1 then
        return "listed in its project"
    end
    if redis.call("ZSCORE", K.outbox, uuid) then return "in the outbox" end
    if redis.call("ZSCORE", K.deadlines, uuid) then return "has a deadline" end
    local host = f.host
    if host and host ~= "" then
        if redis.call("SISMEMBER", K.host_building(host), uuid) == 1 then
            return "host " .. host .. " is building it"
        end
        if redis.call("ZSCORE", K.host_deleting(host), uuid) then
            return "host " .. host .. " is deleting it"
        end
        if redis.call("ZSCORE", K.host_actions(host), uuid) then
            return "host " .. host .. " has an action under way"
        end
    end
    local group = f.group or ""
    if group ~= "" and redis.call("SISMEMBER", K.group_members(group), uuid) == 1 then
        return "a member of server group " .. group
    end
    return nil
end

-- The record and its history as one JSON object; the events stay the JSON texts they
-- are (decoding them here would round their times to 14 digits).
local function history(uuid, raw)
    local events = redis.call("LRANGE", K.instance_events(uuid), 0, -1)
    return '{"uuid":' .. cjson.encode(uuid) .. ',"archived_at":' .. now
        .. ',"record":' .. cjson.encode(raw) .. ',"events":[' .. table.concat(events, ",")
        .. "]}"
end

local function archive(uuid, f, raw)
    redis.call("HSET", K.archive_staged, uuid, history(uuid, raw))
    redis.call("DEL", K.instance(uuid), K.instance_events(uuid))
    redis.call("ZREM", index, uuid)
    redis.call("ZREM", K.project_deleted(f.project_id), uuid)
    if f.batch and f.batch ~= "" then redis.call("SREM", K.batch_members(f.batch), uuid) end
end

local start = 0
if after ~= "" then
    local rank = redis.call("ZRANK", index, after)
    if rank then start = rank + 1 end  -- gone (archived meanwhile): from the oldest again
end
local entries = redis.call("ZRANGE", index, start, start + batch - 1, "WITHSCORES")
local archived, kept, stale, cursor = {}, {}, {}, after
local reached = #entries < 2 * batch  -- the index ends within this step
for i = 1, #entries, 2 do
    local uuid = entries[i]
    if tonumber(entries[i + 1]) >= before then reached = true; break end
    local flat = redis.call("HGETALL", K.instance(uuid))
    if #flat == 0 then
        -- an index entry without its record: nothing to keep, only the entry to drop
        stale[#stale + 1] = uuid
        if dry then cursor = uuid else redis.call("ZREM", index, uuid) end
    else
        local f = {}
        for j = 1, #flat, 2 do f[flat[j]] = flat[j + 1] end
        local why = held(uuid, f)
        if why then
            kept[#kept + 1] = {uuid, why}
            cursor = uuid
        else
            archived[#archived + 1] = uuid
            if dry then cursor = uuid else archive(uuid, f, f) end
        end
    end
end
local left = redis.call("ZCOUNT", index, "-inf", "(" .. ARGV[2])
return reply({archived = archived, held = kept, stale = stale, cursor = cursor,
              done = reached, left = left})
