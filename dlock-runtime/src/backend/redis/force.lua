-- A forced release (after lock.lua): deletes the lock whoever holds it, raises its slot's
-- fencing counter past every fence handed out, and wakes the place first in line, as
-- release.lua does. The holder's next renewal finds the key gone (Lost).
-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] the queue (same cluster slot).
-- ARGV[1] PUBLISH or SPUBLISH, ARGV[2] the client's clock in µs (for the fence).
-- Returns false when the key was free, else the value it held.
local held = redis.call('GET', KEYS[1])
if not held then
  return false
end
redis.call('DEL', KEYS[1])
fence(KEYS[2])
local next = string.sub(redis.call('LINDEX', KEYS[3], 0) or '', 1, 8)
redis.pcall(ARGV[1], KEYS[1], next)
return held
