-- What `Locker::inspect` reads of one lock, in one round trip.
-- KEYS[1] lock key, KEYS[2] the places' deadlines of its queue (same cluster slot).
-- Returns {value or false, remaining ms (PTTL), places in line that are still live}.
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
return {
  redis.call('GET', KEYS[1]),
  redis.call('PTTL', KEYS[1]),
  redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf'),
}
