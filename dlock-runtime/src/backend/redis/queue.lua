-- The queue of waiting places of a key, shared by the scripts that keep one (prepended to
-- acquire_queued.lua, and to RedLock's acquire.lua for the key's first master): a list of
-- places in line and a sorted set of their deadlines (server time in ms after which a place
-- counts as gone), in the key's slot.

-- The server's clock in ms.
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Places whose waiters stopped trying leave from the head of the line. Returns the place first
-- in line after them (false for none), so that the caller does not read it again.
local function drop_lapsed(queue, deadlines, now)
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then return false end
    local gone_at = redis.call('ZSCORE', deadlines, head)
    if gone_at and tonumber(gone_at) > now then return head end
    redis.call('LPOP', queue)
    redis.call('ZREM', deadlines, head)
  end
end

-- `place` in line (at the back when it was not) with a deadline `live` ms from `now`; the
-- keys expire once every place would have lapsed.
local function join_queue(queue, deadlines, place, live, now)
  if redis.call('ZADD', deadlines, now + live, place) == 1 then
    redis.call('RPUSH', queue, place)
  end
  redis.call('PEXPIRE', queue, 2 * live)
  redis.call('PEXPIRE', deadlines, 2 * live)
end

-- `place` out of line.
local function leave_line(queue, deadlines, place)
  if redis.call('ZREM', deadlines, place) == 1 then
    redis.call('LREM', queue, 1, place)
  end
end
