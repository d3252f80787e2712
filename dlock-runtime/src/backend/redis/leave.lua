-- (After wake_head.lua.) A place leaves the key's queue (its process has no more waiters). When
-- the key is free, the place then first is woken, on its channel, as release.lua wakes it; with
-- no place left in the queue nobody is woken (every waiter of a mutex with a place listens on its
-- place's channel). While the key is held nobody is woken: its release (or, on RedLock, the
-- releasing client) names the place first in line then, and a wake-up now would only cost that
-- place's process a refused attempt -- as when the place leaves because its own process has just
-- taken the lock, or been passed it.
-- KEYS[1] lock key, KEYS[2] the queue, KEYS[3] the places' deadlines.
-- ARGV[1] the place; ARGV[2] PUBLISH or SPUBLISH.
-- Returns 1 if the place was in the queue, else 0, plus 2 when the notification was refused.
if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then
  return 0
end
redis.call('LREM', KEYS[2], 1, ARGV[1])
-- PTTL, not EXISTS: a command every ACL rule for dlock grants already (-2: no key).
if redis.call('PTTL', KEYS[1]) ~= -2 then
  return 1
end
if wake_head(KEYS[2], ARGV[2]) == 2 then
  return 3
end
return 1
