-- Compare-and-delete, then wake the waiters.
-- KEYS[1] lock key, KEYS[2] the queue of waiting places, KEYS[3] the places' deadlines.
-- ARGV[1] token; ARGV[2] the command that announces it: PUBLISH, or SPUBLISH on a Cluster (a shard
-- channel, heard on the nodes of the key's slot only).
-- Deletes the key only while it still holds this acquisition's token. Returns 1 if deleted, else 0,
-- plus 2 when the server refused the notification (a user without permission on the channel): the
-- notification is a courtesy to waiters, and must never turn a release that deleted into an error.
-- Publishes on the channel named like the lock key when the lock or the head of its line moved;
-- the message is the first 8 hex digits of the place now first in line (only its waiters wake),
-- or empty (anyone). Never a whole token or place.
-- ARGV[1] may also be a place leaving the queue (its process has no more waiters).
local deleted = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  deleted = 1
end
local left = 0
if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
  redis.call('LREM', KEYS[2], 1, ARGV[1])
  left = 1
end
if deleted == 1 or left == 1 then
  local next = string.sub(redis.call('LINDEX', KEYS[2], 0) or '', 1, 8)
  local published = redis.pcall(ARGV[2], KEYS[1], next)
  if type(published) == 'table' and published.err then
    return deleted + 2
  end
end
return deleted
