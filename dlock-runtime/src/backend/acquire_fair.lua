-- Fair acquire, in one round trip (after lock.lua): first come, first served among waiters.
-- KEYS[1] lock key, KEYS[2] queue (list of waiting tokens), KEYS[3] waiter deadlines (sorted set,
-- score = server time in ms after which the waiter counts as gone), KEYS[4] fencing counter.
-- ARGV[1] token, ARGV[2] lease in ms, ARGV[3] how long a waiter stays queued without trying again.
-- Replies as lock.lua says.
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
-- Waiters that gave up without saying so leave from the head of the line.
while true do
  local head = redis.call('LINDEX', KEYS[2], 0)
  if not head then break end
  local gone_at = redis.call('ZSCORE', KEYS[3], head)
  if gone_at and tonumber(gone_at) > now then break end
  redis.call('LPOP', KEYS[2])
  redis.call('ZREM', KEYS[3], head)
end
local held = redis.call('GET', KEYS[1])
local mine = already_mine(KEYS[1], KEYS[4], held, ARGV[1], ARGV[2])
if mine then
  return mine
end
local head = redis.call('LINDEX', KEYS[2], 0)
if held == false and (head == false or head == ARGV[1]) then
  if head then
    redis.call('LPOP', KEYS[2])
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return fence(KEYS[4])
end
-- Wait in line (or refresh our place), and keep the queue no longer than its waiters need it.
if redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
end
redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[3]))
redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[3]))
if held == false then
  return 0
end
return refused(KEYS[1], ARGV[2])
