-- Compare-and-delete. KEYS[1] lock key; ARGV[1] token.
-- Deletes the key only while it still holds this acquisition's token. Returns 1 if deleted, else 0.
local held = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ':'
if held and string.sub(held, 1, #mine) == mine then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
