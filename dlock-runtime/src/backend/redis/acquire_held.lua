-- After acquire.lua and lock.lua: the key was held when acquire.lua asked. Ours already (a
-- retry whose first reply was lost: a new fence, the lease from now), or refused.
local held = redis.call('GET', KEYS[1])
return already_mine(KEYS[1], KEYS[2], held, ARGV[1], ARGV[2]) or refused(KEYS[1], ARGV[2])
