-- Compare-and-extend. KEYS[1] lock key; ARGV[1] token; ARGV[2] new lease in milliseconds.
-- Never re-creates a key that is gone: returns 1 if extended, 0 if the key is gone or not ours.
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'string' and string.sub(held, 1, 32) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
