-- RedLock: the fence a master grants (prepended to acquire.lua and pass.lua, after
-- ../redis/lock.lua). `proposed` is the client's proposal (its clock in µs, or more): granted
-- only when above this master's counter, which then holds it; a fence lands on every master of
-- the majority that grants it, and every later majority shares one of them, whose counter then
-- refuses anything not above it. Returns the proposal, granted, or {counter} when the counter is
-- at or above it (a lagging clock: nothing changed; the client proposes more than the counter).
local function grant(counter, proposed)
  local current = redis.call('GET', counter)
  if current and tonumber(current) >= tonumber(proposed) then
    return {current}
  end
  redis.call('SET', counter, proposed)
  return tonumber(proposed)
end
