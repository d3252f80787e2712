-- A permit of a semaphore, or a read or write hold of a read/write lock, in one round trip
-- (after lock.lua and shared.lua).
-- KEYS[1] lock key (a hash), KEYS[2] fencing counter (same cluster slot).
-- ARGV[1] token, ARGV[2] the holder's record, ARGV[3] lease in ms, ARGV[4] mode: p, r or w,
-- ARGV[5] the key's kind (`permits=N` or `rw`), ARGV[6] N (permits; 0 for rw), ARGV[7] how long
-- a waiting writer's claim stays without another attempt (ms), ARGV[8] the client's clock in
-- µs (for the fence).
-- Replies: > 0 granted, that fence; < 0 refused, a hold ends within (-1 - reply) ms; 0 refused
-- with no end known (readers behind a waiting writer); a string: the key is another kind of
-- lock (nothing changed).
local lock, token, mode = KEYS[1], ARGV[1], ARGV[4]
local t = redis.call('TYPE', lock)['ok']
if t == 'string' then
  return 'it is held as a mutex'
elseif t ~= 'hash' and t ~= 'none' then
  return 'the key holds a Redis ' .. t .. ', not a dlock lock'
end
local now = now_ms()
local s = scan(lock, now, mode == 'r')
local kind = redis.call('HGET', lock, 'kind')
if kind and kind ~= ARGV[5] then
  if s.holds > 0 or #s.waiting > 0 then
    local permits = string.match(kind, '^permits=(%d+)$')
    if permits then
      return 'it is held as a semaphore of ' .. permits .. ' permits'
    end
    return 'it is held as a read/write lock'
  end
  redis.call('DEL', lock)
  s = { holds = 0, writer = false, soonest = nil, waiting = {} }
end
local waiting = 'w:' .. token
local function grant()
  local f = fence(KEYS[2])
  redis.call('HSET', lock, token,
    string.format('%.0f', now + tonumber(ARGV[3])) .. ' ' .. mode .. ' ' .. string.format('%.0f', f) .. ' ' .. ARGV[2],
    'kind', ARGV[5])
  redis.call('HDEL', lock, waiting)
  keep_at_least(lock, ARGV[3])
  return f
end
-- Ours already (a retry after a lost reply): a new fence and the lease from now.
if redis.call('HEXISTS', lock, token) == 1 then
  return grant()
end
local free
if mode == 'p' then
  free = s.holds < tonumber(ARGV[6])
elseif mode == 'w' then
  free = s.holds == 0 and first_writer(s.waiting, waiting)
else
  free = not s.writer and #s.waiting == 0
end
if free then
  return grant()
end
if mode == 'w' then
  local claim = redis.call('HGET', lock, waiting)
  local arrival = claim and string.match(claim, '^%d+ (%d+)') or redis.call('HINCRBY', lock, 'arrivals', 1)
  redis.call('HSET', lock, waiting, string.format('%.0f', now + tonumber(ARGV[7])) .. ' ' .. arrival, 'kind', ARGV[5])
  keep_at_least(lock, ARGV[7])
end
if s.soonest then
  return -1 - s.soonest
end
return 0
