-- Acquire, in one round trip (after lock.lua).
-- KEYS[1] lock key, KEYS[2] fencing counter (same cluster slot as KEYS[1])
-- ARGV[1] this acquisition's token, ARGV[2] lease in milliseconds, ARGV[3] the client's clock in µs
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return fence(KEYS[2])
end
local held = redis.call('GET', KEYS[1])
return already_mine(KEYS[1], KEYS[2], held, ARGV[1], ARGV[2]) or refused(KEYS[1], ARGV[2])
