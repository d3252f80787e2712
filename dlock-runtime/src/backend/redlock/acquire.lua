-- RedLock's acquire on one master, in one round (after acquire_free.lua, which sets the lock
-- (`taken`, with `value`) and takes a first attempt's grant itself, then ../redis/lock.lua,
-- queue.lua and grant.lua): the lock, and the fence the client proposes (its clock in µs, or
-- more), kept as this master's counter.
-- KEYS[1] lock key, KEYS[2] fencing counter (same cluster slot as KEYS[1])
-- ARGV[1] the lock's value (this acquisition's token and its holder's record), ARGV[2] lease in milliseconds, ARGV[3] the proposed fence
-- Reply: > 0 the lock is ours, with the proposed fence (now this master's counter);
--        < 0 someone else holds it for another (-1 - reply) ms;
--        {counter} it is free, but this master's counter is at or above the proposal (a lagging
--        clock): the counter is left as it was; propose more than the counter.
-- A fence lands on every master of the majority that grants it, and every later majority
-- shares one of them, whose counter then refuses anything not above it: fences strictly
-- increase across majorities, in one round.
-- From a place in the queue of the key's first master (that master only, with 4 keys): KEYS[3]
-- the queue, KEYS[4] the places' deadlines (server time in ms); ARGV[4] how long a place lives
-- without another attempt (ms), ARGV[5] the place, ARGV[6] '1': on a grant keep the place
-- (moved to the back), ARGV[7] '1': a refusal joins the queue or refreshes the place (after
-- taking lapsed places off its head), '0': the place was refreshed lately, a refusal reads the
-- lock alone. So the releasing clients wake one waiting process (see ../redis/acquire_queued.lua,
-- whose queue this is, and wake.lua).
local queued = #KEYS == 4

local function join()
  local now = server_ms()
  drop_lapsed(KEYS[3], KEYS[4], now)
  join_queue(KEYS[3], KEYS[4], ARGV[5], tonumber(ARGV[4]), now)
end

-- A grant from a place: the place is in the queue, and stays there until the client has a
-- majority (then it takes the place out, place.lua), as releases by a holder of the other
-- masters must still find it (a first attempt from it joins, as a refusal would); kept for the
-- process's next waiter, it goes to the back of the queue.
local function granted_from_place()
  if ARGV[6] == '1' then
    leave_line(KEYS[3], KEYS[4], ARGV[5])
    join()
  elseif ARGV[7] == '1' then
    join()
  end
end

if taken then
  local granted = grant(KEYS[2], ARGV[3])
  if type(granted) == 'table' then
    redis.call('DEL', KEYS[1])
  elseif queued then
    granted_from_place()
  end
  return granted
end
if token_of(redis.call('GET', KEYS[1])) == token_of(ARGV[1]) then
  -- A retry whose first reply was lost: a new fence, the lease from now.
  local granted = grant(KEYS[2], ARGV[3])
  if type(granted) ~= 'table' then
    redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
    if queued then
      granted_from_place()
    end
  end
  return granted
end
if queued and ARGV[7] == '1' then
  join()
end
return refused(KEYS[1], ARGV[2])
