-- Acquire, in one round trip.
-- KEYS[1] lock key, KEYS[2] fencing counter (same cluster slot as KEYS[1])
-- ARGV[1] this acquisition's token, ARGV[2] lease in milliseconds
-- Returns {1, fence} when the lock is ours, {0, ttl_ms} when someone else holds it.
-- The stored value is "<token>:<fence>", so a retry after an ambiguous reply recognises its own
-- acquisition and gets the same fence back.
local held = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ':'
if held == false then
  local fence = redis.call('INCR', KEYS[2])
  if fence == 1 then
    -- A counter that starts over (new server, restart without persistence, eviction) starts from
    -- the server clock in microseconds, above anything the previous counter could have issued
    -- unless it issued more than one fence per microsecond on average.
    local now = redis.call('TIME')
    fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('SET', KEYS[2], string.format('%.0f', fence))
  end
  redis.call('SET', KEYS[1], mine .. string.format('%.0f', fence), 'PX', ARGV[2])
  return {1, fence}
end
if string.sub(held, 1, #mine) == mine then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(string.sub(held, #mine + 1))}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 then
  -- TTL recheck: a key left without expiry (crashed or foreign writer) is given one.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  ttl = tonumber(ARGV[2])
end
return {0, ttl}
