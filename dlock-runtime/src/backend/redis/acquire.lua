-- Acquire, in one round trip: this, then lock.lua and acquire_held.lua for a key that is held.
-- KEYS[1] lock key, KEYS[2] fencing counter (same cluster slot as KEYS[1])
-- ARGV[1] the lock's value (this acquisition's token and its holder's record), ARGV[2] lease in milliseconds, ARGV[3] the client's clock in µs
-- A free key is taken here, before lock.lua's functions are made: a script makes its functions
-- (closures) at every call, and making and calling them cost the server 7.6k instructions per
-- acquisition (82.8k against 75.2k a cycle of acquire and release, counted under cachegrind).
-- These are the steps of lock.lua's set_lock and fence, written out, with `NX`: the value with
-- the fence the clock proposes, the hybrid fence from the counter (GETSET of the clock; one more
-- than the counter when that was at or above it, then written into the counter and the value).
local proposed = ARGV[3]
if redis.call('SET', KEYS[1], ARGV[1] .. ' fence=' .. proposed, 'NX', 'PX', ARGV[2]) then
  local f = tonumber(proposed)
  local before = tonumber(redis.call('GETSET', KEYS[2], proposed))
  if before and before >= f then
    f = before + 1
    local fence = string.format('%.0f', f)
    redis.call('SET', KEYS[2], fence)
    redis.call('SET', KEYS[1], ARGV[1] .. ' fence=' .. fence, 'PX', ARGV[2])
  end
  return f
end
