-- Acquire from a place in the key's queue, in one round trip (after lock.lua and queue.lua). The queue holds
-- places, one per waiting process and key (its locker's in-process line), so that a release
-- wakes one process rather than every waiter, and a process keeps its place for the waiters
-- behind the one that takes the lock.
-- KEYS[1] lock key, KEYS[2] queue (list of places), KEYS[3] place deadlines (sorted set, score =
-- server time in ms after which the place counts as gone), KEYS[4] fencing counter.
-- ARGV[1] the lock's value (token and holder's record), ARGV[2] lease in ms, ARGV[3] how long a place stays without another attempt,
-- ARGV[4] the place, ARGV[5] '1': on success keep the place (moved to the back of the queue),
-- ARGV[6] '1': strict (fair mode): take the lock only when the place is first in the queue;
-- '0': take it whenever it is free (the queue then only says whom a release wakes); ARGV[7] '0':
-- the place is in the queue, refreshed lately by this process, so a held key is answered by
-- reading it alone (a woken waiter that the releasing process beat to the key costs 3 commands,
-- not the 9 of the queue's bookkeeping); '1': join the queue or refresh the place either way;
-- ARGV[8] the client's clock in µs (for the fence).
-- Replies as lock.lua says.
local held = redis.call('GET', KEYS[1])
if held and ARGV[7] == '0' then
  return already_mine(KEYS[1], KEYS[4], held, ARGV[1], ARGV[2]) or refused(KEYS[1], ARGV[2])
end
local now = server_ms()
local live = tonumber(ARGV[3])
local place = ARGV[4]
local head = drop_lapsed(KEYS[2], KEYS[3], now)
local mine = already_mine(KEYS[1], KEYS[4], held, ARGV[1], ARGV[2])
if mine then
  return mine
end
local function queue_place()
  join_queue(KEYS[2], KEYS[3], place, live, now)
end
if held == false then
  if ARGV[6] ~= '1' or head == false or head == place then
    leave_line(KEYS[2], KEYS[3], place)
    local f = set_lock(KEYS[1], KEYS[4], ARGV[1], ARGV[2])
    if ARGV[5] == '1' then
      queue_place()
    end
    return f
  end
  queue_place()
  return 0
end
queue_place()
return refused(KEYS[1], ARGV[2])
