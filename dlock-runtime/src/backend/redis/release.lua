-- Compare-and-delete, then wake the waiters.
-- KEYS[1] lock key, KEYS[2] the queue of waiting places (same cluster slot; RedLock's masters but
-- the key's first are not given it for a release, only for an undoing). ARGV[1] token. Before this
-- text the client writes the line that sets `publish` and `announce`: written in for one server, a
-- Sentinel's master and a Cluster (`0`; each argument of a call costs the server about 2k
-- instructions), and for RedLock told by the number of keys (see `release_script`). `publish` the
-- command that announces it: PUBLISH, or SPUBLISH on a Cluster (a shard channel, heard on the
-- nodes of the key's slot only); `announce` '0': announce a deletion only while a place waits in
-- the queue (every waiting process of a mutex keeps one there before it sleeps, so an empty queue
-- means nobody to wake); '1': announce every deletion on the lock key's channel (RedLock's masters
-- but the key's first, for waiters that could not listen on the first; these masters keep no
-- queue, so it is not looked at); '-': announce nothing, and add 4 to the reply when a place waits
-- in the queue (RedLock's first master, whose queue holds the waiting processes' places: the
-- client wakes the first of them once a majority released, see wake.lua; and RedLock undoing an
-- attempt no majority granted, which wakes nobody).
-- Deletes the key only while it still holds this acquisition's token. Returns 1 if deleted, else 0,
-- plus 2 when the server refused the notification (a user without permission on the channel): the
-- notification is a courtesy to waiters, and must never turn a release that deleted into an error.
-- A deletion that a place waits for is published on that place's channel, the queue's name, ':'
-- and the place's first 8 hex digits (which a process's places share): only the process whose
-- place is first in line hears it, however many processes wait. The message is those 8 digits.
-- RedLock's masters but the key's first ('1') announce on the channel named like the lock key
-- with an empty message (anyone). Never a whole token or place. A release nobody waits for runs
-- GET, DEL and LINDEX only ('0'; '1': GET, DEL and PUBLISH).
-- A key that became a semaphore or read/write lock (a hash) is not this hold's either.
local held = redis.pcall('GET', KEYS[1])
local deleted = 0
if type(held) == 'string' and string.sub(held, 1, 32) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  deleted = 1
end
if announce == '-' then
  if redis.call('LINDEX', KEYS[2], 0) then
    return deleted + 4
  end
  return deleted
end
if deleted == 0 then
  return 0
end
local channel, next = KEYS[1], ''
if announce ~= '1' then
  local head = redis.call('LINDEX', KEYS[2], 0)
  if not head then
    return 1
  end
  next = string.sub(head, 1, 8)
  channel = KEYS[2] .. ':' .. next
end
local published = redis.pcall(publish, channel, next)
if type(published) == 'table' and published.err then
  return 3
end
return 1
