-- Gives up a hold (or a writer's wait) of a semaphore or read/write lock, then wakes the
-- waiters (after shared.lua).
-- KEYS[1] lock key (a hash). ARGV[1] token; ARGV[2] PUBLISH or SPUBLISH.
-- Returns 1 if the token held the key, else 0, plus 2 when the notification was refused. The
-- key goes once nothing is held or waited for in it; every change is published (an empty
-- message: any waiter may go now).
local lock, token = KEYS[1], ARGV[1]
if redis.call('TYPE', lock)['ok'] ~= 'hash' then
  return 0
end
local now = now_ms()
local held = 0
local value = redis.call('HGET', lock, token)
if value then
  local ends = hold_of(value)
  if ends and ends > now then held = 1 end
end
local removed = redis.call('HDEL', lock, token, 'w:' .. token)
local s = scan(lock, now, false)
if s.holds == 0 and #s.waiting == 0 then
  redis.call('DEL', lock)
end
if removed > 0 then
  local published = redis.pcall(ARGV[2], lock, '')
  if type(published) == 'table' and published.err then
    return held + 2
  end
end
return held
