-- Acquire from a place in the key's queue, in one round trip (after lock.lua). The queue holds
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
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local live = tonumber(ARGV[3])
local place = ARGV[4]
-- Places whose waiters stopped trying leave from the head of the line.
while true do
  local head = redis.call('LINDEX', KEYS[2], 0)
  if not head then break end
  local gone_at = redis.call('ZSCORE', KEYS[3], head)
  if gone_at and tonumber(gone_at) > now then break end
  redis.call('LPOP', KEYS[2])
  redis.call('ZREM', KEYS[3], head)
end
local mine = already_mine(KEYS[1], KEYS[4], held, ARGV[1], ARGV[2])
if mine then
  return mine
end
local function queue_place()
  if redis.call('ZADD', KEYS[3], now + live, place) == 1 then
    redis.call('RPUSH', KEYS[2], place)
  end
  redis.call('PEXPIRE', KEYS[2], 2 * live)
  redis.call('PEXPIRE', KEYS[3], 2 * live)
end
if held == false then
  local head = redis.call('LINDEX', KEYS[2], 0)
  if ARGV[6] ~= '1' or head == false or head == place then
    if redis.call('ZREM', KEYS[3], place) == 1 then
      redis.call('LREM', KEYS[2], 1, place)
    end
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
