-- RedLock's acquire on one master, in one round (after ../redis/lock.lua): the lock, and the
-- fence the client proposes (its clock in µs, or more), kept as this master's counter.
-- KEYS[1] lock key, KEYS[2] fencing counter (same cluster slot as KEYS[1])
-- ARGV[1] the lock's value (this acquisition's token and its holder's record), ARGV[2] lease in milliseconds, ARGV[3] the proposed fence
-- Reply: > 0 the lock is ours, with the proposed fence (now this master's counter);
--        < 0 someone else holds it for another (-1 - reply) ms;
--        {counter} it is free, but this master's counter is at or above the proposal (a lagging
--        clock): nothing changed; propose more than the counter.
-- A fence lands on every master of the majority that grants it, and every later majority
-- shares one of them, whose counter then refuses anything not above it: fences strictly
-- increase across majorities, in one round.
local function grant()
  local counter = redis.call('GET', KEYS[2])
  if counter and tonumber(counter) >= tonumber(ARGV[3]) then
    return {counter}
  end
  redis.call('SET', KEYS[2], ARGV[3])
  return tonumber(ARGV[3])
end

-- The value records the fence this master granted (`fence=N`), for `dlock show`.
local value = ARGV[1] .. ' fence=' .. ARGV[3]
if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
  local granted = grant()
  if type(granted) == 'table' then
    redis.call('DEL', KEYS[1])
  end
  return granted
end
if token_of(redis.call('GET', KEYS[1])) == token_of(ARGV[1]) then
  -- A retry whose first reply was lost: a new fence, the lease from now.
  local granted = grant()
  if type(granted) ~= 'table' then
    redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
  end
  return granted
end
return refused(KEYS[1], ARGV[2])
