-- Acquire, in one round trip (after lock.lua).
-- KEYS[1] lock key, KEYS[2] fencing counter (same cluster slot as KEYS[1])
-- ARGV[1] this acquisition's token, ARGV[2] lease in milliseconds
-- Returns {1, fence} when the lock is ours, {0, ttl_ms} when someone else holds it.
local held = redis.call('GET', KEYS[1])
if held == false then
  return take(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
end
return already_mine(KEYS[1], held, ARGV[1], ARGV[2]) or refused(KEYS[1], ARGV[2])
