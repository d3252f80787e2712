-- Hand a lock straight from its holder to the next waiter of the same process, without freeing
-- it (after lock.lua): the key takes the next holder's token and lease, and a new fence is
-- issued. Nobody is woken: the lock was never free.
-- KEYS[1] lock key, KEYS[2] fencing counter (same cluster slot as KEYS[1]).
-- ARGV[1] the holder's token, ARGV[2] the next holder's value (token and record), ARGV[3] its lease in ms, ARGV[4]
-- the client's clock in µs (for the fence).
-- Returns the new hold's fence, or 0 when the key is not the holder's (nothing changed).
-- A key that holds the next holder's token already was passed by this pass's first sending,
-- whose reply was lost with its connection (the next holder never asks the server while it
-- waits for a pass): it is set again with a new fence (nobody learnt the first), so that the
-- pass can be sent again (by dlock, or by a Cluster connection's own retries).
local held = redis.pcall('GET', KEYS[1])
if type(held) ~= 'string' then
  return 0
end
local holder = token_of(held)
if holder ~= ARGV[1] and holder ~= token_of(ARGV[2]) then
  return 0
end
return set_lock(KEYS[1], KEYS[2], ARGV[2], ARGV[3])
