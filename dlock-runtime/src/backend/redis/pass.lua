-- Hand a lock straight from its holder to the next waiter of the same process, without freeing
-- it (after lock.lua): the key takes the next holder's token and lease, and a new fence is
-- issued. Nobody is woken: the lock was never free.
-- KEYS[1] lock key, KEYS[2] fencing counter (same cluster slot as KEYS[1]).
-- ARGV[1] the holder's token, ARGV[2] the next holder's value (token and record), ARGV[3] its lease in ms, ARGV[4]
-- the client's clock in µs (for the fence).
-- Returns the new hold's fence, or 0 when the key is not the holder's (nothing changed).
local held = redis.pcall('GET', KEYS[1])
if type(held) ~= 'string' or token_of(held) ~= ARGV[1] then
  return 0
end
return set_lock(KEYS[1], KEYS[2], ARGV[2], ARGV[3])
