-- RedLock: wakes the waiting process whose place is first in the queue of the key's first master,
-- on that place's channel (as ../redis/release.lua names it), sent by a releasing client once its
-- release round has answered: a waiter woken by the first master's own release could ask before
-- the other masters of the majority had let the key go, be refused, and sleep until its poll.
-- KEYS[1] the queue; ARGV[1] PUBLISH or SPUBLISH.
-- Returns 1 when a place was woken, 0 when none waits, 2 when the server refused the notification.
local head = redis.call('LINDEX', KEYS[1], 0)
if not head then
  return 0
end
local next = string.sub(head, 1, 8)
local published = redis.pcall(ARGV[1], KEYS[1] .. ':' .. next, next)
if type(published) == 'table' and published.err then
  return 2
end
return 1
