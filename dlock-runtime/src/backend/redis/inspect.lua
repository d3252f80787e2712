-- What `Locker::inspect` reads of one lock, in one round trip (after shared.lua).
-- KEYS[1] lock key, KEYS[2] the places' deadlines of its queue (same cluster slot).
-- Returns {value or false, remaining ms (PTTL), waiters, false, {}} for a mutex: the places in line
-- that are still live; {false, PTTL, waiting writers, kind, {hold values…}} for a semaphore or
-- read/write lock (a hash, see shared.lua).
local now = now_ms()
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  local s = scan(KEYS[1], now, false)
  local holds = {}
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if #all[i] == 32 then holds[#holds + 1] = all[i + 1] end
  end
  return { false, redis.call('PTTL', KEYS[1]), #s.waiting, redis.call('HGET', KEYS[1], 'kind') or '', holds }
end
return {
  redis.call('GET', KEYS[1]),
  redis.call('PTTL', KEYS[1]),
  redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf'),
  false,
  {},
}
