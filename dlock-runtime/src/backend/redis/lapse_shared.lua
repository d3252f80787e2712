-- A mutex acquisition found a semaphore or read/write lock (a hash) at its key (after
-- shared.lua): drops what lapsed in it, and deletes it when nothing is held or waited for any
-- more (its own expiry is the latest end it ever had, which may be long after the last live
-- hold ended). KEYS[1] lock key. Returns 1 when the key is no such lock (any more), 0 when it
-- still is one.
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
  return 1
end
local s = scan(KEYS[1], now_ms(), false)
if s.holds == 0 and #s.waiting == 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
