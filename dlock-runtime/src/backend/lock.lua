-- Shared by the acquire scripts: prepended to acquire.lua and acquire_fair.lua (Redis scripts
-- cannot include one another). A lock's value is "<token>:<fence>".

-- Takes `lock` for `token` for `lease` ms, with the next fence from `counter`. Returns {1, fence}.
local function take(lock, counter, token, lease)
  local fence = redis.call('INCR', counter)
  if fence == 1 then
    -- A counter that starts over (new server, restart without persistence, eviction) starts from
    -- the server clock in microseconds, above anything the previous counter could have issued
    -- unless it issued more than one fence per microsecond on average.
    local now = redis.call('TIME')
    fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('SET', counter, string.format('%.0f', fence))
  end
  redis.call('SET', lock, token .. ':' .. string.format('%.0f', fence), 'PX', lease)
  return {1, fence}
end

-- When `held` (the lock's value) is `token`'s, as after a retry whose first reply was lost:
-- resets the lease and returns {1, fence}. Otherwise nil.
local function already_mine(lock, held, token, lease)
  local mine = token .. ':'
  if held and string.sub(held, 1, #mine) == mine then
    redis.call('PEXPIRE', lock, lease)
    return {1, tonumber(string.sub(held, #mine + 1))}
  end
  return nil
end

-- Someone else holds `lock`: returns {0, remaining ms}. A lock left without expiry (a crashed
-- or foreign writer) is given `lease` first: the TTL recheck.
local function refused(lock, lease)
  local ttl = redis.call('PTTL', lock)
  if ttl == -1 then
    redis.call('PEXPIRE', lock, lease)
    ttl = tonumber(lease)
  end
  return {0, ttl}
end
