-- Shared by the scripts of semaphores and read/write locks (prepended to them, after lock.lua):
-- such a lock is a hash at the lock key, findable with redis-cli (`HGETALL dlock:export:42`):
--   `kind`          what the key is while anyone holds or waits: `permits=N` or `rw`;
--   `<token>`       a hold (32 hex digits): `<end ms> <mode> <fence> <holder's record>`, mode
--                   `p` (a permit), `r` (read) or `w` (write), its end by the server's clock;
--   `w:<token>`     a writer waiting (a read/write lock): `<gone ms> <arrival>`; while one waits,
--                   no new reader is let in, and writers take the lock in the order they came;
--   `arrivals`      the counter that numbers waiting writers.
-- The key's own expiry is the latest end of anything in it, so an abandoned lock vanishes.

-- The server's clock in ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- What a hold's value says: its end, its mode, its fence.
local function hold_of(value)
  local ends, mode, f = string.match(value, '^(%d+) (%a) (%d+)')
  return tonumber(ends), mode, f
end

-- Keeps `lock` at least `ms` more.
local function keep_at_least(lock, ms)
  local ttl = redis.call('PTTL', lock)
  if ttl < tonumber(ms) then
    redis.call('PEXPIRE', lock, ms)
  end
end

-- Reads the hash at `lock`, dropping what lapsed by `now`: the live holds, whether a writer
-- holds, the soonest end of a hold (of a writer's, with `writers_only`), and the waiting
-- writers as {field, arrival}.
local function scan(lock, now, writers_only)
  local all = redis.call('HGETALL', lock)
  local s = { holds = 0, writer = false, soonest = nil, waiting = {} }
  for i = 1, #all, 2 do
    local field, value = all[i], all[i + 1]
    if #field == 32 then
      local ends, mode = hold_of(value)
      if not ends or ends <= now then
        redis.call('HDEL', lock, field)
      else
        s.holds = s.holds + 1
        if mode == 'w' then s.writer = true end
        if mode == 'w' or not writers_only then
          local left = ends - now
          if not s.soonest or left < s.soonest then s.soonest = left end
        end
      end
    elseif string.sub(field, 1, 2) == 'w:' then
      local gone, arrival = string.match(value, '^(%d+) (%d+)')
      if not gone or tonumber(gone) <= now then
        redis.call('HDEL', lock, field)
      else
        s.waiting[#s.waiting + 1] = { field, tonumber(arrival) }
      end
    end
  end
  return s
end

-- Whether `field` (a waiting writer's) came first among the waiting writers, or none waits.
local function first_writer(waiting, field)
  local first = nil
  for _, w in ipairs(waiting) do
    if not first or w[2] < first[2] then first = w end
  end
  return first == nil or first[1] == field
end
