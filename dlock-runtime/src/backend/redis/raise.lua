-- RedLock's second round: raises the fencing counter to a fence a majority chose, so that every
-- later fence of this node is higher. Counters only go up: a higher one is left as it is.
-- KEYS[1] fencing counter; ARGV[1] the fence. Returns 1.
local before = tonumber(redis.call('GET', KEYS[1]) or '0')
if before < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
