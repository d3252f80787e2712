-- Extends a hold of a semaphore or read/write lock (after shared.lua), only while it lasts:
-- never re-creates one. KEYS[1] lock key (a hash); ARGV[1] token; ARGV[2] new lease in ms.
-- Returns 1 if extended, 0 if the hold is gone.
local lock, token = KEYS[1], ARGV[1]
if redis.call('TYPE', lock)['ok'] ~= 'hash' then
  return 0
end
local value = redis.call('HGET', lock, token)
if not value then
  return 0
end
local now = now_ms()
local ends = hold_of(value)
if not ends or ends <= now then
  return 0
end
local rest = string.sub(value, #string.match(value, '^%d+') + 1)
redis.call('HSET', lock, token, string.format('%.0f', now + tonumber(ARGV[2])) .. rest)
keep_at_least(lock, ARGV[2])
return 1
