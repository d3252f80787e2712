-- A forced release (after lock.lua, shared.lua and wake_head.lua): deletes the lock whoever holds
-- it, raises its slot's fencing counter past every fence handed out, and wakes the place first in
-- line on its channel, as release.lua does. The holder's next renewal finds the key gone (Lost).
-- Of a semaphore or read/write lock (a hash), every hold goes; writers waiting keep their place.
-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] the queue (same cluster slot).
-- ARGV[1] PUBLISH or SPUBLISH, ARGV[2] the client's clock in µs (for the fence).
-- Returns false when the key was free, else the value it held, or {kind, {hold values…}}.
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  local s = scan(KEYS[1], now_ms(), false)
  if s.holds == 0 then
    return false
  end
  local holds = {}
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if #all[i] == 32 then
      holds[#holds + 1] = all[i + 1]
      redis.call('HDEL', KEYS[1], all[i])
    end
  end
  local kind = redis.call('HGET', KEYS[1], 'kind') or ''
  if #s.waiting == 0 then
    redis.call('DEL', KEYS[1])
  end
  fence(KEYS[2])
  redis.pcall(ARGV[1], KEYS[1], '')
  return { kind, holds }
end
local held = redis.call('GET', KEYS[1])
if not held then
  return false
end
redis.call('DEL', KEYS[1])
fence(KEYS[2])
-- A place waits: on its channel. None: anyone, on the key's channel (RedLock's waiters without a
-- place listen there).
if wake_head(KEYS[3], ARGV[1]) == 0 then
  redis.pcall(ARGV[1], KEYS[1], '')
end
return held
