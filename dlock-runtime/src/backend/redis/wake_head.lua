-- Prepended to the scripts that wake the place first in a key's queue (leave.lua, force.lua,
-- RedLock's wake.lua): on that place's channel, `<queue>:<its first 8 hex digits>`, as
-- release.lua names it (which writes the same lines out: it runs at every release, and a
-- function defined here would be made at each call).
-- Returns 0 when no place waits, 1 when one was woken, 2 when the server refused the notification.
local function wake_head(queue, publish)
  local head = redis.call('LINDEX', queue, 0)
  if not head then
    return 0
  end
  local next = string.sub(head, 1, 8)
  local published = redis.pcall(publish, queue .. ':' .. next, next)
  if type(published) == 'table' and published.err then
    return 2
  end
  return 1
end
