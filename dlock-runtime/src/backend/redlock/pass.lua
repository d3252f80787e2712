-- RedLock's pass on one master (after ../redis/lock.lua and grant.lua): the lock goes straight
-- from its holder to the next waiter of the same process, without being freed, with a new fence
-- proposed as acquire.lua's is. Nobody is woken: the key was never free.
-- KEYS[1] lock key, KEYS[2] fencing counter (same cluster slot as KEYS[1])
-- ARGV[1] the holder's token, ARGV[2] the next holder's value (token and record), ARGV[3] its
-- lease in ms, ARGV[4] the proposed fence
-- Reply: > 0 passed, with the proposed fence (now this master's counter); 0 the key is neither
-- the holder's nor already this pass's (nothing changed); {counter} this master's counter is at
-- or above the proposal (the lock and the counter are left as they were; propose more than the
-- counter).
-- A key that holds this very value (token and record, stamped once per pass by the client) is
-- this pass asked again (its second round above a lagging clock, or a sending whose reply was
-- lost with its connection): granted again with the new proposal, the lease from now. Not the
-- next holder's token alone: its own attempt answered late, or an earlier pass to it, may have
-- set that with this holder's hold over, and the holder would be told it had passed a lock it
-- had lost.
local held = redis.pcall('GET', KEYS[1])
if type(held) ~= 'string' then
  return 0
end
if token_of(held) ~= ARGV[1] and string.sub(held, 1, #ARGV[2] + 7) ~= ARGV[2] .. ' fence=' then
  return 0
end
local granted = grant(KEYS[2], ARGV[4])
if type(granted) ~= 'table' then
  redis.call('SET', KEYS[1], ARGV[2] .. ' fence=' .. ARGV[4], 'PX', ARGV[3])
end
return granted
