-- Shared by the scripts that grant a lock: prepended to acquire_queued.lua and pass.lua, and put
-- between acquire.lua (a free key) and acquire_held.lua (a held one), and RedLock's scripts (after
-- ../redlock/acquire_free.lua in its acquire): Redis scripts cannot include one another. A lock's
-- value is its acquisition's token (32 hex digits), a space, and its holder's record (`owner=…
-- host=… pid=… since=…`, for `dlock show` and redis-cli): a hold is recognised by the token alone.
-- The fencing token is issued from the counter in the same script, so fences follow the order in
-- which holds begin. Acquire replies with one integer: > 0 the lock is ours and that is its fence;
-- < 0 someone else holds it for another (-1 - reply) ms; 0 it is free but another fair waiter is
-- first in line.

-- The next fence from `counter`: the client's clock in µs (the last argument of every script that
-- grants), or the counter plus one when that is at or above it (a hybrid clock), in one call --
-- GETSET of the clock, whose old value is the counter; only when the counter was ahead of the clock
-- (a clock behind another client's, or stepped back) is it set again. A counter that goes back -- a
-- restart without persistence, an eviction, or a failover to a replica that missed the last writes
-- -- thus never re-issues a fence handed out before, as long as the next client's clock is not
-- behind the clock of the one that issued that fence by more than the time since. (The server's
-- clock would do as well, but reading it in a script (TIME) cost more server time than the rest of
-- the acquisition: a sixth of the throughput of 16 clients, measured.)
local function fence(counter)
  local f = tonumber(ARGV[#ARGV])
  local before = tonumber(redis.call('GETSET', counter, ARGV[#ARGV]))
  if before and before >= f then
    f = before + 1
    redis.call('SET', counter, string.format('%.0f', f))
  end
  return f
end

-- The token of a lock's value (or of the value an acquisition sets); false for none.
local function token_of(value)
  return value and string.sub(value, 1, 32)
end

-- Sets `lock` to `value` for `lease` ms with the next fence from `counter`, recorded in the
-- value as `fence=N` (for `dlock show`). The value is written with the fence the client's clock
-- proposes, which the fence is unless the counter was at or above it (then it is written
-- again): two commands, as a lock without the record. acquire.lua writes these steps and
-- `fence`'s out for a free key (it runs before these functions are made): change both together.
local function set_lock(lock, counter, value, lease)
  local proposed = ARGV[#ARGV]
  redis.call('SET', lock, value .. ' fence=' .. proposed, 'PX', lease)
  local f = fence(counter)
  if f ~= tonumber(proposed) then
    redis.call('SET', lock, value .. ' fence=' .. string.format('%.0f', f), 'PX', lease)
  end
  return f
end

-- When `held` (the lock's value) is `value`'s token, as after a retry whose first reply was lost:
-- sets it again with a new fence (nobody learnt the first one) and the lease from now.
-- Otherwise nil.
local function already_mine(lock, counter, held, value, lease)
  if held and token_of(held) == token_of(value) then
    return set_lock(lock, counter, value, lease)
  end
  return nil
end

-- Someone else holds `lock`: returns -1 - its remaining ms. A lock left without expiry (a
-- crashed or foreign writer) is given `lease` first: the TTL recheck.
local function refused(lock, lease)
  local ttl = redis.call('PTTL', lock)
  if ttl == -1 then
    redis.call('PEXPIRE', lock, lease)
    ttl = tonumber(lease)
  end
  return -1 - ttl
end
