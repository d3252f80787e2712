-- RedLock's acquire on one master, first part (then ../redis/lock.lua, queue.lua, grant.lua and
-- acquire.lua, which reads `value` and `taken` from here): the lock's `SET NX PX`, and for an
-- attempt without a place in a queue (2 keys: a first attempt, or any on the masters but the key's
-- first) that took the key, the grant written out, before those files' functions are made: a
-- script makes its functions (closures) at every call, on every master, as on one server (see
-- ../redis/acquire.lua). The steps of grant.lua's `grant`: change both together. Reply as
-- acquire.lua's.
-- The value records the fence this master granted (`fence=N`), for `dlock show`.
local value = ARGV[1] .. ' fence=' .. ARGV[3]
local taken = redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
if taken and #KEYS == 2 then
  local current = redis.call('GETSET', KEYS[2], ARGV[3])
  local n = tonumber(current)
  if n and n >= tonumber(ARGV[3]) then
    redis.call('SET', KEYS[2], current)
    redis.call('DEL', KEYS[1])
    return {current}
  end
  return tonumber(ARGV[3])
end
