-- Compare-and-delete, then wake the waiters.
-- KEYS[1] lock key, KEYS[2] fair queue, KEYS[3] fair waiter deadlines
-- ARGV[1] token, ARGV[2] '1' when the caller may be queued in fair mode.
-- Deletes the key only while it still holds this acquisition's token. Returns 1 if deleted, else 0.
-- Publishes on the channel named like the lock key when the lock or the head of its line moved.
local held = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ':'
local deleted = 0
if held and string.sub(held, 1, #mine) == mine then
  redis.call('DEL', KEYS[1])
  deleted = 1
end
local left = 0
if ARGV[2] == '1' and redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
  redis.call('LREM', KEYS[2], 1, ARGV[1])
  left = 1
end
if deleted == 1 or left == 1 then
  redis.call('PUBLISH', KEYS[1], '')
end
return deleted
