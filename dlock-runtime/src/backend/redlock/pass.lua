-- RedLock's pass on one master (after ../redis/lock.lua and grant.lua): the lock goes straight
-- from its holder to the next waiter of the same process, without being freed, with a new fence
-- proposed as acquire.lua's is. Nobody is woken: the key was never free.
-- KEYS[1] lock key, KEYS[2] fencing counter (same cluster slot as KEYS[1])
-- ARGV[1] the holder's token, ARGV[2] the next holder's value (token and record), ARGV[3] its
-- lease in ms, ARGV[4] the proposed fence
-- Reply: > 0 passed, with the proposed fence (now this master's counter); 0 the key is neither
-- the holder's nor already the next holder's (nothing changed); {counter} this master's counter
-- is at or above the proposal (the lock and the counter are left as they were; propose more
-- than the counter).
-- A key already the next holder's is a pass asked again (a lagging clock, or a lost reply):
-- granted again with the new proposal, the lease from now.
local held = redis.pcall('GET', KEYS[1])
if type(held) ~= 'string' then
  return 0
end
local holder = token_of(held)
if holder ~= ARGV[1] and holder ~= token_of(ARGV[2]) then
  return 0
end
local granted = grant(KEYS[2], ARGV[4])
if type(granted) ~= 'table' then
  redis.call('SET', KEYS[1], ARGV[2] .. ' fence=' .. ARGV[4], 'PX', ARGV[3])
end
return granted
