-- Hand a lock straight from its holder to the next waiter of the same process, without freeing
-- it (after lock.lua): the key takes the next holder's token and lease, and a new fence is
-- issued. Nobody is woken: the lock was never free.
-- KEYS[1] lock key, KEYS[2] fencing counter (same cluster slot as KEYS[1]).
-- ARGV[1] the holder's token, ARGV[2] the next holder's value (token and record), ARGV[3] its lease in ms, ARGV[4]
-- the client's clock in µs (for the fence).
-- Returns the new hold's fence, or 0 when the key is not the holder's (nothing changed).
-- A key that holds this very value (token and record, whose `since=` the client stamps when it
-- writes the pass) was passed by this pass's first sending, whose reply was lost with its
-- connection: it is set again with a new fence (nobody learnt the first), so that the pass can
-- be sent again (by dlock, or by a Cluster connection's own retries). Not the next holder's
-- token alone: an attempt of its own, answered late, or an earlier pass to it may have set that,
-- and this holder's hold would then be over.
local held = redis.pcall('GET', KEYS[1])
if type(held) ~= 'string' then
  return 0
end
if token_of(held) ~= ARGV[1] and string.sub(held, 1, #ARGV[2] + 7) ~= ARGV[2] .. ' fence=' then
  return 0
end
return set_lock(KEYS[1], KEYS[2], ARGV[2], ARGV[3])
